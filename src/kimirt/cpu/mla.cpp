#include "kimirt/cpu/mla.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/base/thread_pool.h"
#include "kimirt/cpu/activation.h"
#include "kimirt/cpu/matmul.h"
#include "kimirt/cpu/norm.h"

namespace kimirt::cpu {
namespace {

std::vector<float> buffer(int64_t n) { return std::vector<float>(static_cast<size_t>(n)); }

void check_weights(const MlaDims& d, const MlaWeights& w) {
  auto need = [](const float* p, const char* name) { KIMIRT_CHECK(p != nullptr, "MLA: weight {} is missing", name); };
  if (d.q_lora_rank > 0) {
    need(w.q_a_proj, "q_a_proj");
    need(w.q_a_norm, "q_a_layernorm");
    need(w.q_b_proj, "q_b_proj");
  } else {
    need(w.q_proj, "q_proj");
  }
  need(w.kv_a_proj, "kv_a_proj_with_mqa");
  need(w.kv_a_norm, "kv_a_layernorm");
  need(w.kv_b_proj, "kv_b_proj");
  if (d.output_gate) need(w.g_proj, "g_proj");
  need(w.o_proj, "o_proj");
}

// In-place softmax of the first n scores. The sum in double: over a long context a float running sum drifts
// (measured 1.4e-5 relative at 131072 keys).
void softmax(float* s, int64_t n) {
  const float mx = *std::max_element(s, s + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - mx);
    sum += s[i];
  }
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) s[i] *= inv;
}

// out[0, width) = Σ_{t < n} p[t] · rows[t · stride ..]: in float within blocks of kSumBlock rows (the loop the
// compiler vectorizes), the blocks' partial sums added in double, so that the error does not grow with the
// context (a float running sum over 1M keys was 2.5e-4 off).
constexpr int64_t kSumBlock = 256;
void weighted_row_sum(const float* p, const float* rows, int64_t stride, int64_t n, int64_t width, float* block,
                      double* total, float* out) {
  std::fill(total, total + width, 0.0);
  for (int64_t t0 = 0; t0 < n; t0 += kSumBlock) {
    std::fill(block, block + width, 0.0f);
    for (int64_t t = t0; t < std::min(n, t0 + kSumBlock); ++t) {
      const float* row = rows + t * stride;
      for (int64_t e = 0; e < width; ++e) block[e] += p[t] * row[e];
    }
    for (int64_t e = 0; e < width; ++e) total[e] += block[e];
  }
  for (int64_t e = 0; e < width; ++e) out[e] = static_cast<float>(total[e]);
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Every latent row the tokens of this call may see: the cached ones, then this call's.
std::vector<float> all_latent_rows(const MlaDims& d, const float* cached, int64_t ctx, const float* fresh,
                                   int64_t tokens) {
  const int64_t lw = d.latent_width();
  std::vector<float> rows = buffer((ctx + tokens) * lw);
  if (ctx > 0) std::copy(cached, cached + ctx * lw, rows.begin());
  std::copy(fresh, fresh + tokens * lw, rows.begin() + ctx * lw);
  return rows;
}

// Prefill form: k_h = [k_nope_h | k_pe], v_h expanded from every latent row through kv_b.
void attend_expanded(const MlaDims& d, const MlaWeights& w, const float* q, const float* latent, int64_t ctx,
                     int64_t tokens, float* o) {
  const int64_t n = ctx + tokens, lw = d.latent_width(), r = d.kv_lora_rank;
  const int64_t dn = d.qk_nope_head_dim, dr = d.qk_rope_head_dim, dv = d.v_head_dim, dq = d.qk_head_dim();
  const int64_t kv_w = d.num_heads * (dn + dv);
  // c_kv of every row, then kv = c_kv · kv_bᵀ → [n, heads, d_nope + d_v].
  auto c = buffer(n * r);
  for (int64_t t = 0; t < n; ++t) std::copy_n(latent + t * lw, r, c.data() + t * r);
  auto kv = buffer(n * kv_w);
  matmul(c.data(), w.kv_b_proj, kv.data(), n, kv_w, r);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dq));
  ThreadPool::global().parallel_for(d.num_heads, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> p(static_cast<size_t>(n)), block(static_cast<size_t>(dv));
    std::vector<double> total(static_cast<size_t>(dv));
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t i = 0; i < tokens; ++i) {
        const float* qh = q + (i * d.num_heads + h) * dq;
        const int64_t visible = ctx + i + 1;  // causal
        for (int64_t t = 0; t < visible; ++t) {
          const float* k_nope = kv.data() + t * kv_w + h * (dn + dv);
          const float* k_pe = latent + t * lw + r;
          p[t] = (dot(qh, k_nope, dn) + dot(qh + dn, k_pe, dr)) * scale;
        }
        softmax(p.data(), visible);
        weighted_row_sum(p.data(), kv.data() + h * (dn + dv) + dn, kv_w, visible, dv, block.data(), total.data(),
                         o + (i * d.num_heads + h) * dv);
      }
    }
  });
}

// Decode form with kv_b absorbed (exact without RoPE): per head, W_UK = kv_b rows [0, d_nope) of the
// head's block and W_UV = rows [d_nope, d_nope + d_v), each [·, kv_lora_rank].
void attend_absorbed(const MlaDims& d, const MlaWeights& w, const float* q, const float* latent, int64_t ctx,
                     int64_t tokens, float* o) {
  const int64_t n = ctx + tokens, lw = d.latent_width(), r = d.kv_lora_rank;
  const int64_t dn = d.qk_nope_head_dim, dr = d.qk_rope_head_dim, dv = d.v_head_dim, dq = d.qk_head_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(dq));
  ThreadPool::global().parallel_for(d.num_heads, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> p(static_cast<size_t>(n)), q_hat(static_cast<size_t>(r)), o_lat(static_cast<size_t>(r));
    std::vector<float> block(static_cast<size_t>(r));
    std::vector<double> total(static_cast<size_t>(r));
    for (int64_t h = h0; h < h1; ++h) {
      const float* w_uk = w.kv_b_proj + h * (dn + dv) * r;
      const float* w_uv = w_uk + dn * r;
      for (int64_t i = 0; i < tokens; ++i) {
        const float* qh = q + (i * d.num_heads + h) * dq;
        // q̂ = W_UKᵀ q_nope
        std::fill(q_hat.begin(), q_hat.end(), 0.0f);
        for (int64_t a = 0; a < dn; ++a) {
          for (int64_t j = 0; j < r; ++j) q_hat[j] += qh[a] * w_uk[a * r + j];
        }
        const int64_t visible = ctx + i + 1;
        for (int64_t t = 0; t < visible; ++t) {
          const float* row = latent + t * lw;
          p[t] = (dot(q_hat.data(), row, r) + dot(qh + dn, row + r, dr)) * scale;
        }
        softmax(p.data(), visible);
        // ō = Σ p c_kv, then o = W_UV ō
        weighted_row_sum(p.data(), latent, lw, visible, r, block.data(), total.data(), o_lat.data());
        float* oh = o + (i * d.num_heads + h) * dv;
        for (int64_t e = 0; e < dv; ++e) oh[e] = dot(w_uv + e * r, o_lat.data(), r);
      }
    }
  });
}

}  // namespace

void validate(const MlaDims& d) {
  KIMIRT_CHECK(d.hidden > 0, "MLA: hidden_size must be positive, got {}", d.hidden);
  KIMIRT_CHECK(d.num_heads > 0, "MLA: num_attention_heads must be positive, got {}", d.num_heads);
  KIMIRT_CHECK(d.q_lora_rank >= 0, "MLA: q_lora_rank must not be negative, got {}", d.q_lora_rank);
  KIMIRT_CHECK(d.kv_lora_rank > 0, "MLA: kv_lora_rank must be positive, got {}", d.kv_lora_rank);
  KIMIRT_CHECK(d.qk_nope_head_dim > 0, "MLA: qk_nope_head_dim must be positive, got {}", d.qk_nope_head_dim);
  KIMIRT_CHECK(d.qk_rope_head_dim >= 0, "MLA: qk_rope_head_dim must not be negative, got {}", d.qk_rope_head_dim);
  KIMIRT_CHECK(d.v_head_dim > 0, "MLA: v_head_dim must be positive, got {}", d.v_head_dim);
  KIMIRT_CHECK(d.latent_norm_eps > 0.0f, "MLA: latent norm eps must be positive, got {}", d.latent_norm_eps);
}

bool mla_prefers_absorbed(const MlaDims& d, int64_t ctx, int64_t tokens) {
  if (tokens <= 1) return true;
  // Multiply-adds per head: scores and sums over every visible (query, key) pair, plus the expansion of the
  // rows (expanded) or the absorption of the queries and outputs (absorbed).
  const double r = static_cast<double>(d.kv_lora_rank), dn = static_cast<double>(d.qk_nope_head_dim);
  const double dr = static_cast<double>(d.qk_rope_head_dim), dv = static_cast<double>(d.v_head_dim);
  const double t = static_cast<double>(tokens), n = static_cast<double>(ctx) + t;
  const double pairs = t * static_cast<double>(ctx) + t * (t + 1.0) / 2.0;
  const double expanded = n * (dn + dv) * r + pairs * (dn + dr + dv);
  const double absorbed = t * (dn + dv) * r + pairs * (2.0 * r + dr);
  // And when the expanded rows would not fit kMlaMaxExpandedBytes: every prefill chunk re-expands the whole
  // context (12.9 GB per call at K3's 96 heads and 131072 positions, 103 GB at 1M), where absorbing costs about
  // twice the multiply-adds and no more memory than the latent rows.
  const double expanded_bytes = n * static_cast<double>(d.num_heads) * (dn + dv) * sizeof(float);
  return absorbed < expanded || expanded_bytes > static_cast<double>(kMlaMaxExpandedBytes);
}

void mla_forward(const MlaDims& d, const MlaWeights& w, const float* x, int64_t tokens, const float* cached,
                 int64_t ctx, float* out, float* new_latent, MlaPath path) {
  validate(d);
  check_weights(d, w);
  KIMIRT_CHECK(tokens >= 0 && ctx >= 0, "MLA: negative token count ({}) or cached length ({})", tokens, ctx);
  KIMIRT_CHECK(ctx == 0 || cached != nullptr, "MLA: {} cached positions but no cached latent rows", ctx);
  if (tokens == 0) return;
  const int64_t H = d.hidden, heads = d.num_heads, dq = d.qk_head_dim(), lw = d.latent_width();
  const int64_t qw = heads * dq, ow = heads * d.v_head_dim;

  // Queries [tokens, heads, d_nope | d_rope].
  auto q = buffer(tokens * qw);
  if (d.q_lora_rank > 0) {
    auto q_lat = buffer(tokens * d.q_lora_rank);
    matmul(x, w.q_a_proj, q_lat.data(), tokens, d.q_lora_rank, H);
    rms_norm(q_lat.data(), w.q_a_norm, q_lat.data(), tokens, d.q_lora_rank, d.latent_norm_eps);
    matmul(q_lat.data(), w.q_b_proj, q.data(), tokens, qw, d.q_lora_rank);
  } else {
    matmul(x, w.q_proj, q.data(), tokens, qw, H);
  }

  // This call's latent rows: [RMSNorm(c_kv) | k_pe] (k_pe is not normalized).
  matmul(x, w.kv_a_proj, new_latent, tokens, lw, H);
  for (int64_t t = 0; t < tokens; ++t) {
    float* c = new_latent + t * lw;
    rms_norm(c, w.kv_a_norm, c, 1, d.kv_lora_rank, d.latent_norm_eps);
  }

  const auto latent = all_latent_rows(d, cached, ctx, new_latent, tokens);
  auto o = buffer(tokens * ow);
  const bool absorbed = path == MlaPath::kAbsorbed || (path == MlaPath::kAuto && mla_prefers_absorbed(d, ctx, tokens));
  if (absorbed) {
    attend_absorbed(d, w, q.data(), latent.data(), ctx, tokens, o.data());
  } else {
    attend_expanded(d, w, q.data(), latent.data(), ctx, tokens, o.data());
  }

  if (d.output_gate) {
    auto g = buffer(tokens * ow);
    matmul(x, w.g_proj, g.data(), tokens, ow, H);
    for (int64_t i = 0; i < tokens * ow; ++i) o[i] *= sigmoid(g[i]);
  }
  matmul(o.data(), w.o_proj, out, tokens, H, ow);
}

}  // namespace kimirt::cpu
