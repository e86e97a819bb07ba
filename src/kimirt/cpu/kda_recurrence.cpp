#include "kimirt/cpu/kda_recurrence.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/base/thread_pool.h"

namespace kimirt::cpu {
namespace {

// exp(−104) is already 0 in float: any log-decay at or below this one gives a decay of exactly 0.
constexpr float kMinLogDecay = -128.0f;

void check_sequence(const KdaSequence& s) {
  KIMIRT_CHECK(s.tokens >= 0 && s.heads > 0 && s.head_dim > 0,
               "KDA: tokens ({}) must not be negative, heads ({}) and head_dim ({}) must be positive", s.tokens,
               s.heads, s.head_dim);
}

// Offset of (token t, head h) in a [tokens, heads, head_dim] array.
int64_t at(const KdaSequence& s, int64_t t, int64_t h) { return (t * s.heads + h) * s.head_dim; }

void recurrent_head(const KdaSequence& s, int64_t h, float* S, float* out) {
  const int64_t n = s.head_dim;
  std::vector<float> kv_mem(static_cast<size_t>(n));
  for (int64_t t = 0; t < s.tokens; ++t) {
    const float* q = s.q + at(s, t, h);
    const float* k = s.k + at(s, t, h);
    const float* v = s.v + at(s, t, h);
    const float* g = s.g + at(s, t, h);
    const float beta = s.beta[t * s.heads + h];
    for (int64_t d = 0; d < n; ++d) {
      const float decay = std::exp(g[d]);
      for (int64_t e = 0; e < n; ++e) S[d * n + e] *= decay;
    }
    std::fill(kv_mem.begin(), kv_mem.end(), 0.0f);
    for (int64_t d = 0; d < n; ++d) {
      for (int64_t e = 0; e < n; ++e) kv_mem[e] += S[d * n + e] * k[d];
    }
    for (int64_t e = 0; e < n; ++e) kv_mem[e] = beta * (v[e] - kv_mem[e]);  // the delta-rule update
    for (int64_t d = 0; d < n; ++d) {
      for (int64_t e = 0; e < n; ++e) S[d * n + e] += k[d] * kv_mem[e];
    }
    float* o = out + at(s, t, h);
    std::fill(o, o + n, 0.0f);
    for (int64_t d = 0; d < n; ++d) {
      for (int64_t e = 0; e < n; ++e) o[e] += S[d * n + e] * q[d];
    }
  }
}

void chunked_head(const KdaSequence& s, int64_t h, float* S, float* out, int64_t chunk) {
  const int64_t n = s.head_dim;
  const auto cn = static_cast<size_t>(chunk * n);
  // Γ [L, K], in double: decays are taken as exp(Γ_i − Γ_j), and in float a large |Γ| (a chunk that starts with
  // a log-decay at kMinLogDecay) leaves that difference good to an ulp of |Γ| only (1.6e-4 off the recurrence).
  std::vector<double> cum(cn);
  std::vector<float> u(cn);  // new values [L, V]
  std::vector<float> A(static_cast<size_t>(chunk * chunk));
  std::vector<float> QK(A.size());
  std::vector<float> tmp(static_cast<size_t>(n));

  for (int64_t t0 = 0; t0 < s.tokens; t0 += chunk) {
    const int64_t L = std::min(chunk, s.tokens - t0);
    auto q = [&](int64_t i) { return s.q + at(s, t0 + i, h); };
    auto k = [&](int64_t i) { return s.k + at(s, t0 + i, h); };
    auto v = [&](int64_t i) { return s.v + at(s, t0 + i, h); };
    auto beta = [&](int64_t i) { return s.beta[(t0 + i) * s.heads + h]; };

    for (int64_t i = 0; i < L; ++i) {
      const float* g = s.g + at(s, t0 + i, h);
      // A log-decay at or below kMinLogDecay decays to exactly 0 in float, as in the recurrence; held there, so
      // that a −∞ one (an overflowing Kimi Linear gate) does not make exp(Γ_i − Γ_i) = exp(−∞ + ∞) NaN.
      for (int64_t d = 0; d < n; ++d) {
        cum[i * n + d] = (i > 0 ? cum[(i - 1) * n + d] : 0.0) + std::max(g[d], kMinLogDecay);
      }
    }
    // exp of a (non-positive) difference of Γs, in float as everywhere else.
    const auto decay = [](double log_decay) { return std::exp(static_cast<float>(log_decay)); };

    // Decay-weighted key products of the chunk: A (strictly lower) and the q·k scores (lower, diagonal in).
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        float kk = 0.0f;
        float qk = 0.0f;
        for (int64_t d = 0; d < n; ++d) {
          const float w = k(j)[d] * decay(cum[i * n + d] - cum[j * n + d]);
          kk += k(i)[d] * w;
          qk += q(i)[d] * w;
        }
        // β_i, the row's: token i's step size, as unrolling the recurrence gives (§3.4.7's β_j is a typo).
        A[i * chunk + j] = j < i ? beta(i) * kk : 0.0f;
        QK[i * chunk + j] = qk;
      }
    }

    // rhs_i = β_i (v_i − Sᵀ(k_i ⊙ exp Γ_i)), then forward substitution through (I + A).
    for (int64_t i = 0; i < L; ++i) {
      float* ui = u.data() + i * n;
      std::copy(v(i), v(i) + n, ui);
      for (int64_t d = 0; d < n; ++d) {
        const float kd = k(i)[d] * decay(cum[i * n + d]);
        for (int64_t e = 0; e < n; ++e) ui[e] -= S[d * n + e] * kd;
      }
      for (int64_t e = 0; e < n; ++e) ui[e] *= beta(i);
      for (int64_t j = 0; j < i; ++j) {
        const float a = A[i * chunk + j];
        const float* uj = u.data() + j * n;
        for (int64_t e = 0; e < n; ++e) ui[e] -= a * uj[e];
      }
    }

    // o_i = Sᵀ(q_i ⊙ exp Γ_i) + Σ_{j≤i} QK[i, j] u_j, with S still the chunk's initial state.
    for (int64_t i = 0; i < L; ++i) {
      float* o = out + at(s, t0 + i, h);
      std::fill(o, o + n, 0.0f);
      for (int64_t d = 0; d < n; ++d) {
        const float qd = q(i)[d] * decay(cum[i * n + d]);
        for (int64_t e = 0; e < n; ++e) o[e] += S[d * n + e] * qd;
      }
      for (int64_t j = 0; j <= i; ++j) {
        const float a = QK[i * chunk + j];
        const float* uj = u.data() + j * n;
        for (int64_t e = 0; e < n; ++e) o[e] += a * uj[e];
      }
    }

    // S ← Diag(exp Γ_last) S + Σ_j (k_j ⊙ exp(Γ_last − Γ_j)) u_jᵀ
    const double* last = cum.data() + (L - 1) * n;
    for (int64_t d = 0; d < n; ++d) {
      const float state_decay = decay(last[d]);
      for (int64_t e = 0; e < n; ++e) S[d * n + e] *= state_decay;
    }
    for (int64_t j = 0; j < L; ++j) {
      for (int64_t d = 0; d < n; ++d) tmp[d] = k(j)[d] * decay(last[d] - cum[j * n + d]);
      const float* uj = u.data() + j * n;
      for (int64_t d = 0; d < n; ++d) {
        for (int64_t e = 0; e < n; ++e) S[d * n + e] += tmp[d] * uj[e];
      }
    }
  }
}

}  // namespace

void kda_recurrent(const KdaSequence& seq, float* state, float* out) {
  check_sequence(seq);
  const int64_t kv = seq.head_dim * seq.head_dim;
  ThreadPool::global().parallel_for(seq.heads, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) recurrent_head(seq, h, state + h * kv, out);
  });
}

void kda_chunked(const KdaSequence& seq, float* state, float* out, int64_t chunk_size) {
  check_sequence(seq);
  KIMIRT_CHECK(chunk_size > 0, "KDA: chunk size must be positive, got {}", chunk_size);
  const int64_t kv = seq.head_dim * seq.head_dim;
  ThreadPool::global().parallel_for(seq.heads, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) chunked_head(seq, h, state + h * kv, out, chunk_size);
  });
}

}  // namespace kimirt::cpu
