#include "kimirt/cpu/kda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kimirt/base/error.h"
#include "test_util.h"

namespace kimirt::cpu {
namespace {

using testing::random_normal;
using testing::random_uniform;
using testing::ref_matmul;
using testing::ref_sigmoid;
using testing::ref_silu;
using testing::rel_error;
using testing::to_double;

// Owns random weights of one KDA layer in either family's layout.
struct Layer {
  KdaDims dims;
  std::vector<float> q_proj, k_proj, v_proj, q_conv, k_conv, v_conv, f_a, f_b, b_proj, a_log, dt_bias, g_proj, g_a, g_b,
      o_norm, o_proj;

  explicit Layer(bool k3) {
    dims.hidden = 24;
    dims.num_heads = 3;
    dims.head_dim = 8;
    dims.conv_width = 4;
    if (k3) dims.gate_lower_bound = -5.0f;
    dims.full_rank_output_gate = k3;
    const int64_t H = dims.hidden, D = dims.channels(), dk = dims.head_dim, W = dims.conv_width;
    const float s = 1.0f / std::sqrt(static_cast<float>(H));
    q_proj = random_normal(D * H, 1, s);
    k_proj = random_normal(D * H, 2, s);
    v_proj = random_normal(D * H, 3, s);
    q_conv = random_normal(D * W, 4, 0.3f);
    k_conv = random_normal(D * W, 5, 0.3f);
    v_conv = random_normal(D * W, 6, 0.3f);
    f_a = random_normal(dk * H, 7, s);
    f_b = random_normal(D * dk, 8, 0.35f);
    b_proj = random_normal(dims.num_heads * H, 9, s);
    a_log = random_uniform(dims.num_heads, 10, std::log(0.5f), std::log(16.0f));
    dt_bias = random_normal(D, 11, 0.5f);
    g_proj = random_normal(D * H, 12, s);
    g_a = random_normal(dk * H, 13, s);
    g_b = random_normal(D * dk, 14, 0.35f);
    o_norm = random_uniform(dk, 15, 0.8f, 1.2f);
    o_proj = random_normal(H * D, 16, 1.0f / std::sqrt(static_cast<float>(D)));
  }

  KdaWeights weights() const {
    KdaWeights w;
    w.q_proj = q_proj.data();
    w.k_proj = k_proj.data();
    w.v_proj = v_proj.data();
    w.q_conv = q_conv.data();
    w.k_conv = k_conv.data();
    w.v_conv = v_conv.data();
    w.f_a_proj = f_a.data();
    w.f_b_proj = f_b.data();
    w.b_proj = b_proj.data();
    w.a_log = a_log.data();
    w.dt_bias = dt_bias.data();
    if (dims.full_rank_output_gate) {
      w.g_proj = g_proj.data();
    } else {
      w.g_a_proj = g_a.data();
      w.g_b_proj = g_b.data();
    }
    w.o_norm = o_norm.data();
    w.o_proj = o_proj.data();
    return w;
  }

  // The whole mixer from zero state in double, written straight from §3.4 (token recurrence).
  std::vector<double> reference(const std::vector<float>& x, int64_t T) const {
    const int64_t H = dims.hidden, D = dims.channels(), dk = dims.head_dim, nh = dims.num_heads, W = dims.conv_width;
    const auto qp = ref_matmul(x, q_proj, T, D, H), kp = ref_matmul(x, k_proj, T, D, H),
               vp = ref_matmul(x, v_proj, T, D, H);
    const auto f = ref_matmul(ref_matmul(x, f_a, T, dk, H), f_b, T, D, dk);
    const auto b = ref_matmul(x, b_proj, T, nh, H);
    const auto gate = dims.full_rank_output_gate ? ref_matmul(x, g_proj, T, D, H)
                                                 : ref_matmul(ref_matmul(x, g_a, T, dk, H), g_b, T, D, dk);
    auto conv = [&](const std::vector<double>& in, const std::vector<float>& w) {
      std::vector<double> y(in.size());
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t c = 0; c < D; ++c) {
          double acc = 0.0;
          for (int64_t j = 0; j < W; ++j) {
            const int64_t src = t - (W - 1) + j;
            if (src >= 0) acc += w[c * W + j] * in[src * D + c];
          }
          y[t * D + c] = ref_silu(acc);
        }
      }
      return y;
    };
    auto q = conv(qp, q_conv), k = conv(kp, k_conv), v = conv(vp, v_conv);
    std::vector<double> o(static_cast<size_t>(T * D)), S(static_cast<size_t>(nh * dk * dk), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < nh; ++h) {
        double* qh = q.data() + t * D + h * dk;
        double* kh = k.data() + t * D + h * dk;
        const double* vh = v.data() + t * D + h * dk;
        double nq = 0.0, nk = 0.0;
        for (int64_t d = 0; d < dk; ++d) {
          nq += qh[d] * qh[d];
          nk += kh[d] * kh[d];
        }
        for (int64_t d = 0; d < dk; ++d) {
          qh[d] /= std::sqrt(nq + 1e-6) * std::sqrt(static_cast<double>(dk));
          kh[d] /= std::sqrt(nk + 1e-6);
        }
        const double a = std::exp(static_cast<double>(a_log[h]));
        const double beta = ref_sigmoid(b[t * nh + h]);
        double* s = S.data() + h * dk * dk;
        for (int64_t d = 0; d < dk; ++d) {
          const double z = f[t * D + h * dk + d] + dt_bias[h * dk + d];
          const double g =
              dims.gate_lower_bound ? *dims.gate_lower_bound * ref_sigmoid(a * z) : -a * std::log1p(std::exp(z));
          for (int64_t e = 0; e < dk; ++e) s[d * dk + e] *= std::exp(g);
        }
        for (int64_t e = 0; e < dk; ++e) {
          double pred = 0.0;
          for (int64_t d = 0; d < dk; ++d) pred += s[d * dk + e] * kh[d];
          const double delta = beta * (vh[e] - pred);
          for (int64_t d = 0; d < dk; ++d) s[d * dk + e] += kh[d] * delta;
        }
        double* oh = o.data() + t * D + h * dk;
        for (int64_t e = 0; e < dk; ++e) {
          for (int64_t d = 0; d < dk; ++d) oh[e] += s[d * dk + e] * qh[d];
        }
        double ms = 0.0;
        for (int64_t e = 0; e < dk; ++e) ms += oh[e] * oh[e];
        const double inv = 1.0 / std::sqrt(ms / static_cast<double>(dk) + dims.rms_norm_eps);
        for (int64_t e = 0; e < dk; ++e) oh[e] *= inv * o_norm[e] * ref_sigmoid(gate[t * D + h * dk + e]);
      }
    }
    return ref_matmul(o, o_proj, T, H, D);
  }
};

TEST(CpuKda, MixerMatchesDoubleReferenceForBothFamilies) {
  for (const bool k3 : {false, true}) {
    const Layer layer(k3);
    const int64_t T = 70;
    const auto x = random_normal(T * layer.dims.hidden, 99);
    const auto ref = layer.reference(x, T);
    for (const KdaMode mode : {KdaMode::kChunked, KdaMode::kRecurrent}) {
      auto state = KdaState::zeros(layer.dims);
      std::vector<float> out(ref.size());
      kda_forward(layer.dims, layer.weights(), x.data(), T, state, out.data(), mode);
      EXPECT_LE(rel_error(out, ref), 1e-5)
          << (k3 ? "K3" : "Kimi Linear") << " mode " << (mode == KdaMode::kChunked ? "chunked" : "recurrent");
    }
  }
}

TEST(CpuKda, DecodeAfterPrefillEqualsOneLongerPrefill) {
  for (const bool k3 : {false, true}) {
    const Layer layer(k3);
    const int64_t T = 75, prefill = 66;
    const auto x = random_normal(T * layer.dims.hidden, 98);
    auto one_state = KdaState::zeros(layer.dims);
    std::vector<float> one(static_cast<size_t>(T * layer.dims.hidden));
    kda_forward(layer.dims, layer.weights(), x.data(), T, one_state, one.data());

    auto state = KdaState::zeros(layer.dims);
    std::vector<float> split(one.size());
    const int64_t H = layer.dims.hidden;
    kda_forward(layer.dims, layer.weights(), x.data(), prefill, state, split.data());  // chunked
    for (int64_t t = prefill; t < T; ++t) {                                            // recurrent, one by one
      kda_forward(layer.dims, layer.weights(), x.data() + t * H, 1, state, split.data() + t * H);
    }
    const char* name = k3 ? "K3" : "Kimi Linear";
    EXPECT_LE(rel_error(split, one), 1e-5) << name;
    EXPECT_LE(rel_error(state.recurrent, one_state.recurrent), 1e-5) << name;
    // The windows hold projections of the same inputs (a 1-row product may round differently).
    EXPECT_LE(rel_error(state.conv_q, one_state.conv_q), 1e-6) << name;
    EXPECT_LE(rel_error(state.conv_k, one_state.conv_k), 1e-6) << name;
    EXPECT_LE(rel_error(state.conv_v, one_state.conv_v), 1e-6) << name;
  }
}

TEST(CpuKda, WrongStateSizeIsAnErrorBeforeAnyWork) {
  const Layer layer(true);
  auto state = KdaState::zeros(layer.dims);
  state.recurrent.resize(5);
  state.conv_q[0] = 42.0f;
  const auto x = random_normal(layer.dims.hidden, 1);
  std::vector<float> out(static_cast<size_t>(layer.dims.hidden));
  try {
    kda_forward(layer.dims, layer.weights(), x.data(), 1, state, out.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recurrent state"), std::string::npos) << e.what();
  }
  EXPECT_EQ(state.conv_q[0], 42.0f);
}

TEST(CpuKda, MissingWeightAndBadDimsNameTheField) {
  const Layer layer(false);
  auto w = layer.weights();
  w.g_b_proj = nullptr;
  auto state = KdaState::zeros(layer.dims);
  const auto x = random_normal(layer.dims.hidden, 1);
  std::vector<float> out(static_cast<size_t>(layer.dims.hidden));
  try {
    kda_forward(layer.dims, w, x.data(), 1, state, out.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("g_b_proj"), std::string::npos) << e.what();
  }
  auto dims = layer.dims;
  dims.gate_lower_bound = 1.0f;
  try {
    validate(dims);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate_lower_bound"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kimirt::cpu
