#include "kimirt/cpu/kda_recurrence.h"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <vector>

#include "kimirt/cpu/kda_gate.h"
#include "test_util.h"

namespace kimirt::cpu {
namespace {

using testing::random_normal;
using testing::random_uniform;
using testing::ref_sigmoid;
using testing::rel_error;

// Random inputs of one sequence with the statistics of the model: unit q/k (q scaled), gates from the
// real gate functions.
struct Inputs {
  int64_t tokens, heads, dim;
  std::vector<float> q, k, v, g, beta;

  Inputs(int64_t t, int64_t h, int64_t d, std::optional<float> lower_bound, uint32_t seed)
      : tokens(t), heads(h), dim(d) {
    q = random_normal(t * h * d, seed);
    k = random_normal(t * h * d, seed + 1);
    v = random_normal(t * h * d, seed + 2);
    for (int64_t r = 0; r < t * h; ++r) {
      double sq = 0.0, sk = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        sq += q[r * d + i] * q[r * d + i];
        sk += k[r * d + i] * k[r * d + i];
      }
      for (int64_t i = 0; i < d; ++i) {
        q[r * d + i] = static_cast<float>(q[r * d + i] / std::sqrt(sq) / std::sqrt(static_cast<double>(d)));
        k[r * d + i] = static_cast<float>(k[r * d + i] / std::sqrt(sk));
      }
    }
    const auto f = random_normal(t * h * d, seed + 3);
    const auto a_log = random_uniform(h, seed + 4, std::log(0.5f), std::log(16.0f));
    const auto dt_bias = random_normal(h * d, seed + 5, 0.5f);
    g.resize(f.size());
    kda_forget_gate(f.data(), a_log.data(), dt_bias.data(), lower_bound, t, h, d, g.data());
    beta = random_uniform(t * h, seed + 6, 0.05f, 0.95f);
  }

  KdaSequence seq(int64_t begin = 0, int64_t end = -1) const {
    if (end < 0) end = tokens;
    const int64_t o = begin * heads * dim;
    return {q.data() + o, k.data() + o, v.data() + o, g.data() + o, beta.data() + begin * heads,
            end - begin,  heads,        dim};
  }
};

// Independent double-precision recurrence (the definition).
void ref_recurrence(const Inputs& in, std::vector<double>& S, std::vector<double>& out) {
  const int64_t n = in.dim;
  out.assign(static_cast<size_t>(in.tokens * in.heads * n), 0.0);
  for (int64_t h = 0; h < in.heads; ++h) {
    double* s = S.data() + h * n * n;
    for (int64_t t = 0; t < in.tokens; ++t) {
      const int64_t o = (t * in.heads + h) * n;
      for (int64_t d = 0; d < n; ++d) {
        for (int64_t e = 0; e < n; ++e) s[d * n + e] *= std::exp(static_cast<double>(in.g[o + d]));
      }
      for (int64_t e = 0; e < n; ++e) {
        double pred = 0.0;
        for (int64_t d = 0; d < n; ++d) pred += s[d * n + e] * in.k[o + d];
        const double delta = in.beta[t * in.heads + h] * (in.v[o + e] - pred);
        for (int64_t d = 0; d < n; ++d) s[d * n + e] += in.k[o + d] * delta;
      }
      for (int64_t e = 0; e < n; ++e) {
        double acc = 0.0;
        for (int64_t d = 0; d < n; ++d) acc += s[d * n + e] * in.q[o + d];
        out[o + e] = acc;
      }
    }
  }
}

TEST(CpuKdaRecurrence, HandCheckedTwoSteps) {
  // One head, K = V = 2. Step 1: k = e0, v = [2, 4], β = 0.5, no decay → S = [[1, 2], [0, 0]].
  // Step 2: g = [ln 0.5, 0] halves row 0 → [[0.5, 1], [0, 0]]; k = e1, v = [1, 1], β = 1 → row 1 = [1, 1].
  // o_t = Sᵀ q with q = [1, 1]: [1, 2] then [1.5, 2].
  const std::vector<float> q = {1, 1, 1, 1}, k = {1, 0, 0, 1}, v = {2, 4, 1, 1};
  const std::vector<float> g = {0, 0, std::log(0.5f), 0}, beta = {0.5f, 1.0f};
  const KdaSequence seq{q.data(), k.data(), v.data(), g.data(), beta.data(), 2, 1, 2};
  for (const bool chunked : {false, true}) {
    std::vector<float> S(4, 0.0f), out(4);
    if (chunked) {
      kda_chunked(seq, S.data(), out.data());
    } else {
      kda_recurrent(seq, S.data(), out.data());
    }
    const std::vector<float> want_out = {1, 2, 1.5f, 2}, want_S = {0.5f, 1, 1, 1};
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(out[i], want_out[i], 1e-6) << (chunked ? "chunked " : "recurrent ") << i;
      EXPECT_NEAR(S[i], want_S[i], 1e-6) << (chunked ? "chunked " : "recurrent ") << i;
    }
  }
}

TEST(CpuKdaRecurrence, RecurrentMatchesDoubleDefinition) {
  const Inputs in(37, 2, 8, -5.0f, 40);
  std::vector<double> S_ref(2 * 8 * 8, 0.0), out_ref;
  ref_recurrence(in, S_ref, out_ref);
  std::vector<float> S(S_ref.size(), 0.0f), out(out_ref.size());
  kda_recurrent(in.seq(), S.data(), out.data());
  EXPECT_LE(rel_error(out, out_ref), 1e-5);
  EXPECT_LE(rel_error(S, S_ref), 1e-5);
}

TEST(CpuKdaRecurrence, ChunkedEqualsRecurrent) {
  const int64_t heads = 2, dim = 16;
  for (const std::optional<float> bound : {std::optional<float>(-5.0f), std::optional<float>()}) {
    for (const int64_t T : {1, 7, 63, 64, 65, 130}) {
      for (const bool with_initial : {false, true}) {
        const Inputs in(T, heads, dim, bound, 50 + static_cast<uint32_t>(T));
        std::vector<float> S0(heads * dim * dim, 0.0f);
        if (with_initial) S0 = random_normal(heads * dim * dim, 7, 0.5f);
        std::vector<float> S_rec = S0, S_chk = S0, o_rec(T * heads * dim), o_chk(o_rec.size());
        kda_recurrent(in.seq(), S_rec.data(), o_rec.data());
        kda_chunked(in.seq(), S_chk.data(), o_chk.data(), 64);
        const char* gate = bound ? "bounded" : "softplus";
        EXPECT_LE(rel_error(o_chk, o_rec), 1e-5) << gate << " T=" << T << " initial=" << with_initial;
        EXPECT_LE(rel_error(S_chk, S_rec), 1e-5) << gate << " T=" << T << " initial=" << with_initial;
      }
    }
  }
}

TEST(CpuKdaRecurrence, ChunkedPrefillSplitAnywhereEqualsOnePrefill) {
  const int64_t T = 150, heads = 2, dim = 16;
  const Inputs in(T, heads, dim, -5.0f, 70);
  std::vector<float> S_one(heads * dim * dim, 0.0f), o_one(T * heads * dim);
  kda_chunked(in.seq(), S_one.data(), o_one.data());
  for (const auto& cuts : std::vector<std::vector<int64_t>>{{1}, {63, 64}, {10, 100, 149}, {64, 128}, {70}}) {
    std::vector<float> S(S_one.size(), 0.0f), o(o_one.size());
    int64_t begin = 0;
    auto run = [&](int64_t end) {
      kda_chunked(in.seq(begin, end), S.data(), o.data() + begin * heads * dim);
      begin = end;
    };
    for (int64_t c : cuts) run(c);
    run(T);
    EXPECT_LE(rel_error(o, o_one), 1e-5) << "first cut " << cuts[0];
    EXPECT_LE(rel_error(S, S_one), 1e-5) << "first cut " << cuts[0];
  }
}

TEST(CpuKdaRecurrence, StrongUnboundedDecayStaysFinite) {
  // Kimi Linear gates can be very negative; exp(Γ) underflows to 0 but nothing may overflow.
  Inputs in(100, 1, 8, std::nullopt, 80);
  for (auto& g : in.g) g = -60.0f;
  std::vector<float> S(64, 1.0f), o(800), S2(64, 1.0f), o2(800);
  kda_chunked(in.seq(), S.data(), o.data());
  kda_recurrent(in.seq(), S2.data(), o2.data());
  for (float x : o) ASSERT_TRUE(std::isfinite(x));
  for (float x : S) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LE(rel_error(o, o2), 1e-5);
}

// A −∞ log-decay (a Kimi Linear gate whose exp(A_log) overflows) zeroes the state in both forms: the chunked one
// gave NaN everywhere (exp(Γ_i − Γ_i) = exp(−∞ + ∞)). A huge decay then small ones: the chunked form's
// exp(Γ_i − Γ_j) had lost 4.6e-4 relative to the cancellation of float Γs near −3000.
TEST(CpuKdaRecurrence, ChunkedMatchesRecurrentAfterAnInfiniteOrHugeDecay) {
  const int64_t T = 70, dim = 8;
  for (const float first : {-INFINITY, -3000.0f}) {
    Inputs in(T, 1, dim, std::nullopt, 90);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t d = 0; d < dim; ++d) in.g[t * dim + d] = t == 0 ? first : -0.02f;
    }
    std::vector<float> S = random_normal(dim * dim, 9, 0.5f), S2 = S, o(T * dim), o2(T * dim);
    kda_chunked(in.seq(), S.data(), o.data());
    kda_recurrent(in.seq(), S2.data(), o2.data());
    for (float x : o) ASSERT_TRUE(std::isfinite(x)) << first;
    EXPECT_LE(rel_error(o, o2), 1e-5) << first;
    EXPECT_LE(rel_error(S, S2), 1e-5) << first;
  }
}

TEST(CpuKdaGate, BothGateKindsMatchFormulas) {
  const std::vector<float> f = {0.3f, -2.0f, 1.0f, 4.0f};  // 1 token, 2 heads, head_dim 2
  const std::vector<float> a_log = {std::log(2.0f), std::log(8.0f)};
  const std::vector<float> dt_bias = {0.1f, 0.0f, -0.5f, 1.0f};
  std::vector<float> g(4);
  kda_forget_gate(f.data(), a_log.data(), dt_bias.data(), -5.0f, 1, 2, 2, g.data());
  const double a[2] = {2.0, 8.0};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(g[i], -5.0 * ref_sigmoid(a[i / 2] * (f[i] + dt_bias[i])), 1e-5) << i;
  }
  kda_forget_gate(f.data(), a_log.data(), dt_bias.data(), std::nullopt, 1, 2, 2, g.data());
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(g[i], -a[i / 2] * std::log1p(std::exp(static_cast<double>(f[i] + dt_bias[i]))), 1e-5) << i;
  }
  std::vector<float> b = {0.0f, 2.0f}, beta(2);
  kda_beta(b.data(), 2, beta.data());
  EXPECT_FLOAT_EQ(beta[0], 0.5f);
  EXPECT_NEAR(beta[1], ref_sigmoid(2.0), 1e-7);
}

}  // namespace
}  // namespace kimirt::cpu
