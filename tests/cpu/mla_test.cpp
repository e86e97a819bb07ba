#include "kimirt/cpu/mla.h"

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
using testing::ref_rms_norm;
using testing::ref_sigmoid;
using testing::rel_error;

// Random weights of one MLA layer: K3 style (q-LoRA, output gate) or Kimi Linear style (direct q_proj).
struct Layer {
  MlaDims dims;
  std::vector<float> q_proj, q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, g_proj, o_proj;

  explicit Layer(bool k3) {
    dims.hidden = 32;
    dims.num_heads = 3;
    dims.q_lora_rank = k3 ? 20 : 0;
    dims.kv_lora_rank = 16;
    dims.qk_nope_head_dim = 8;
    dims.qk_rope_head_dim = 4;
    dims.v_head_dim = 6;
    dims.output_gate = k3;
    dims.latent_norm_eps = 1e-6f;
    const int64_t H = dims.hidden, nh = dims.num_heads, dq = dims.qk_head_dim();
    const float s = 1.0f / std::sqrt(static_cast<float>(H));
    q_proj = random_normal(nh * dq * H, 1, s);
    q_a = random_normal(dims.q_lora_rank * H, 2, s);
    q_a_norm = random_uniform(dims.q_lora_rank, 3, 0.8f, 1.2f);
    q_b = random_normal(nh * dq * dims.q_lora_rank, 4, 0.25f);
    kv_a = random_normal(dims.latent_width() * H, 5, s);
    kv_a_norm = random_uniform(dims.kv_lora_rank, 6, 0.8f, 1.2f);
    kv_b = random_normal(nh * (dims.qk_nope_head_dim + dims.v_head_dim) * dims.kv_lora_rank, 7, 0.25f);
    g_proj = random_normal(nh * dims.v_head_dim * H, 8, s);
    o_proj = random_normal(H * nh * dims.v_head_dim, 9, 0.3f);
  }

  MlaWeights weights() const {
    MlaWeights w;
    if (dims.q_lora_rank > 0) {
      w.q_a_proj = q_a.data();
      w.q_a_norm = q_a_norm.data();
      w.q_b_proj = q_b.data();
    } else {
      w.q_proj = q_proj.data();
    }
    w.kv_a_proj = kv_a.data();
    w.kv_a_norm = kv_a_norm.data();
    w.kv_b_proj = kv_b.data();
    if (dims.output_gate) w.g_proj = g_proj.data();
    w.o_proj = o_proj.data();
    return w;
  }

  // Causal NoPE MLA over a whole sequence in double, straight from §3.5 (expanded keys and values).
  std::vector<double> reference(const std::vector<float>& x, int64_t T) const {
    const int64_t H = dims.hidden, nh = dims.num_heads, dn = dims.qk_nope_head_dim, dr = dims.qk_rope_head_dim,
                  dv = dims.v_head_dim, dq = dims.qk_head_dim(), r = dims.kv_lora_rank;
    const double eps = dims.latent_norm_eps;
    const auto q =
        dims.q_lora_rank > 0
            ? ref_matmul(ref_rms_norm(ref_matmul(x, q_a, T, dims.q_lora_rank, H), q_a_norm, T, dims.q_lora_rank, eps),
                         q_b, T, nh * dq, dims.q_lora_rank)
            : ref_matmul(x, q_proj, T, nh * dq, H);
    const auto c = ref_matmul(x, kv_a, T, r + dr, H);
    std::vector<double> c_kv(static_cast<size_t>(T * r));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < r; ++i) c_kv[t * r + i] = c[t * (r + dr) + i];
    }
    const auto kv = ref_matmul(ref_rms_norm(c_kv, kv_a_norm, T, r, eps), kv_b, T, nh * (dn + dv), r);
    std::vector<double> o(static_cast<size_t>(T * nh * dv), 0.0);
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0.0;
          for (int64_t a = 0; a < dn; ++a) acc += q[(i * nh + h) * dq + a] * kv[(j * nh + h) * (dn + dv) + a];
          for (int64_t a = 0; a < dr; ++a) acc += q[(i * nh + h) * dq + dn + a] * c[j * (r + dr) + r + a];
          s[j] = acc / std::sqrt(static_cast<double>(dq));
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < dv; ++e) {
            o[(i * nh + h) * dv + e] += s[j] / sum * kv[(j * nh + h) * (dn + dv) + dn + e];
          }
        }
      }
    }
    if (dims.output_gate) {
      const auto g = ref_matmul(x, g_proj, T, nh * dv, H);
      for (size_t i = 0; i < o.size(); ++i) o[i] *= ref_sigmoid(g[i]);
    }
    return ref_matmul(o, o_proj, T, H, nh * dv);
  }
};

const char* name(bool k3) { return k3 ? "K3 (q-LoRA, gate)" : "Kimi Linear (q_proj)"; }

TEST(CpuMla, PrefillMatchesDoubleReference) {
  for (const bool k3 : {false, true}) {
    const Layer layer(k3);
    const int64_t T = 13;
    const auto x = random_normal(T * layer.dims.hidden, 30);
    const auto ref = layer.reference(x, T);
    for (const MlaPath path : {MlaPath::kExpanded, MlaPath::kAbsorbed}) {
      std::vector<float> out(ref.size()), latent(static_cast<size_t>(T * layer.dims.latent_width()));
      mla_forward(layer.dims, layer.weights(), x.data(), T, nullptr, 0, out.data(), latent.data(), path);
      EXPECT_LE(rel_error(out, ref), 2e-6) << name(k3) << (path == MlaPath::kExpanded ? " expanded" : " absorbed");
    }
  }
}

TEST(CpuMla, LatentRowsAreNormedCkvThenRawKpe) {
  const Layer layer(true);
  const int64_t T = 2, r = layer.dims.kv_lora_rank, lw = layer.dims.latent_width();
  const auto x = random_normal(T * layer.dims.hidden, 31);
  std::vector<float> out(static_cast<size_t>(T * layer.dims.hidden)), latent(static_cast<size_t>(T * lw));
  mla_forward(layer.dims, layer.weights(), x.data(), T, nullptr, 0, out.data(), latent.data());
  const auto c = ref_matmul(x, layer.kv_a, T, lw, layer.dims.hidden);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> ckv(c.begin() + t * lw, c.begin() + t * lw + r);
    const auto normed = ref_rms_norm(ckv, layer.kv_a_norm, 1, r, 1e-6);
    for (int64_t i = 0; i < r; ++i) EXPECT_NEAR(latent[t * lw + i], normed[i], 1e-5);
    for (int64_t i = r; i < lw; ++i) EXPECT_NEAR(latent[t * lw + i], c[t * lw + i], 1e-5);
  }
}

TEST(CpuMla, AbsorbedDecodeEqualsPrefillTokenByToken) {
  for (const bool k3 : {false, true}) {
    const Layer layer(k3);
    const int64_t T = 12, H = layer.dims.hidden, lw = layer.dims.latent_width();
    const auto x = random_normal(T * H, 32);
    std::vector<float> full(static_cast<size_t>(T * H)), full_latent(static_cast<size_t>(T * lw));
    mla_forward(layer.dims, layer.weights(), x.data(), T, nullptr, 0, full.data(), full_latent.data(),
                MlaPath::kExpanded);
    std::vector<float> cache, step(static_cast<size_t>(T * H));
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> row(static_cast<size_t>(lw));
      // kAuto picks the absorbed path for one token.
      mla_forward(layer.dims, layer.weights(), x.data() + t * H, 1, cache.data(), t, step.data() + t * H, row.data());
      cache.insert(cache.end(), row.begin(), row.end());
    }
    EXPECT_LE(rel_error(step, full), 2e-6) << name(k3);
    EXPECT_LE(rel_error(cache, full_latent), 1e-6) << name(k3);
  }
}

TEST(CpuMla, PrefillOverCachedLatentPlusChunkEqualsOnePrefill) {
  for (const bool k3 : {false, true}) {
    const Layer layer(k3);
    const int64_t T = 17, H = layer.dims.hidden, lw = layer.dims.latent_width();
    const auto x = random_normal(T * H, 33);
    std::vector<float> full(static_cast<size_t>(T * H)), full_latent(static_cast<size_t>(T * lw));
    mla_forward(layer.dims, layer.weights(), x.data(), T, nullptr, 0, full.data(), full_latent.data());
    // kAuto expands the 12 tokens after 5 and absorbs the 2 after 15 (checked below) and the 1 after 16.
    EXPECT_FALSE(mla_prefers_absorbed(layer.dims, 5, T - 5));
    EXPECT_TRUE(mla_prefers_absorbed(layer.dims, 15, T - 15));
    for (const int64_t cut : {1, 5, 15, 16}) {
      std::vector<float> out(full.size()), latent(full_latent.size());
      mla_forward(layer.dims, layer.weights(), x.data(), cut, nullptr, 0, out.data(), latent.data());
      mla_forward(layer.dims, layer.weights(), x.data() + cut * H, T - cut, latent.data(), cut, out.data() + cut * H,
                  latent.data() + cut * lw);
      EXPECT_LE(rel_error(out, full), 2e-6) << name(k3) << " cut " << cut;
    }
  }
}

TEST(CpuMla, AutoPathAtK3Dims) {
  // K3's MLA: 96 heads, kv_lora_rank 512, d_nope 128, d_rope 64, d_v 128. Expanding costs (ctx + tokens) x 128k
  // multiply-adds per head, absorbing 768 more per (query, key) pair: a continuation is absorbed up to about
  // 170 tokens, whatever the context (and at 32k context the expanded rows alone took 3.2 GB).
  MlaDims d;
  d.hidden = 7168;
  d.num_heads = 96;
  d.q_lora_rank = 1536;
  d.kv_lora_rank = 512;
  d.qk_nope_head_dim = 128;
  d.qk_rope_head_dim = 64;
  d.v_head_dim = 128;
  EXPECT_TRUE(mla_prefers_absorbed(d, 0, 1));
  EXPECT_FALSE(mla_prefers_absorbed(d, 0, 2));  // a first prefill
  EXPECT_FALSE(mla_prefers_absorbed(d, 0, 4096));
  EXPECT_TRUE(mla_prefers_absorbed(d, 32768, 2));
  EXPECT_TRUE(mla_prefers_absorbed(d, 32768, 160));
  // Past 1 GiB of expanded rows (96 heads x 256 floats = 96 KiB a row: 10922 rows) the absorbed form, whatever
  // the multiply-adds: a 512-token chunk after 32k positions had expanded 3.2 GB, after 1M 103 GB.
  EXPECT_FALSE(mla_prefers_absorbed(d, 8192, 512));
  EXPECT_TRUE(mla_prefers_absorbed(d, 32768, 512));
  EXPECT_TRUE(mla_prefers_absorbed(d, 0, 16384));     // even a first prefill that long
  EXPECT_TRUE(mla_prefers_absorbed(d, 32768, 4096));  // fewer multiply-adds expanded, but 3.5 GB
  EXPECT_TRUE(mla_prefers_absorbed(d, 1 << 20, 100));
}

TEST(CpuMla, BadInputsNameTheProblem) {
  const Layer layer(true);
  const auto x = random_normal(layer.dims.hidden, 1);
  std::vector<float> out(static_cast<size_t>(layer.dims.hidden)),
      latent(static_cast<size_t>(layer.dims.latent_width()));
  EXPECT_THROW(mla_forward(layer.dims, layer.weights(), x.data(), 1, nullptr, 3, out.data(), latent.data()), Error);
  auto w = layer.weights();
  w.q_a_norm = nullptr;
  try {
    mla_forward(layer.dims, w, x.data(), 1, nullptr, 0, out.data(), latent.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_a_layernorm"), std::string::npos) << e.what();
  }
  auto dims = layer.dims;
  dims.kv_lora_rank = 0;
  EXPECT_THROW(validate(dims), Error);
}

}  // namespace
}  // namespace kimirt::cpu
