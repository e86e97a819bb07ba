// Gated NoPE Multi-head Latent Attention of one sequence (§3.5), fp32. The cache holds, per position, the
// normalized latent c_kv (kv_lora_rank) followed by k_pe (qk_rope_head_dim): "latent rows". No rotary
// embedding is applied anywhere (mla_use_nope); the rope dims are ordinary content dims.
#pragma once

#include <cstdint>

namespace kimirt::cpu {

struct MlaDims {
  int64_t hidden = 0;            // H
  int64_t num_heads = 0;         // num_attention_heads
  int64_t q_lora_rank = 0;       // 0 (q_lora_rank null): direct q_proj (Kimi Linear)
  int64_t kv_lora_rank = 0;      // r_kv
  int64_t qk_nope_head_dim = 0;  // d_nope
  int64_t qk_rope_head_dim = 0;  // d_rope
  int64_t v_head_dim = 0;        // d_v
  bool output_gate = false;      // mla_use_output_gate: o ← o ⊙ σ(x · g_projᵀ) before o_proj
  // ε of q_a_layernorm / kv_a_layernorm. The goldens use 1e-6 (the reference's default), not rms_norm_eps.
  float latent_norm_eps = 1e-6f;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t latent_width() const { return kv_lora_rank + qk_rope_head_dim; }  // one cached row
};

// Throws an Error naming the offending field.
void validate(const MlaDims& dims);

struct MlaWeights {
  const float* q_proj = nullptr;     // [heads × (d_nope + d_rope), H]     when q_lora_rank == 0
  const float* q_a_proj = nullptr;   // [q_lora_rank, H]                   when q_lora_rank > 0
  const float* q_a_norm = nullptr;   // [q_lora_rank]
  const float* q_b_proj = nullptr;   // [heads × (d_nope + d_rope), q_lora_rank]
  const float* kv_a_proj = nullptr;  // [kv_lora_rank + d_rope, H]  (kv_a_proj_with_mqa)
  const float* kv_a_norm = nullptr;  // [kv_lora_rank]
  const float* kv_b_proj = nullptr;  // [heads × (d_nope + d_v), kv_lora_rank], per head [k_nope | v]
  const float* g_proj = nullptr;     // [heads × d_v, H]   when output_gate
  const float* o_proj = nullptr;     // [H, heads × d_v]
};

enum class MlaPath {
  kAuto,      // mla_prefers_absorbed's choice
  kExpanded,  // prefill: kv_b expands every latent row to per-head k_nope | v
  kAbsorbed,  // decode: q̂ = W_UKᵀ q_nope, scores on the latent, o = W_UV · Σ p c_kv
};

// Whether MlaPath::kAuto takes the absorbed form for `tokens` new tokens after `ctx` cached ones: always for
// one token (decode), otherwise when it does fewer multiply-adds. The expanded form pays for expanding every
// cached row through kv_b (and holds all of them, [ctx + tokens, heads, d_nope + d_v] floats), the absorbed
// one for scoring and summing on the wider latent: a short continuation of a long context (a chat turn, a
// chunk of a prefill) is absorbed, a first prefill expanded. Also whenever the expanded rows would take more than
// kMlaMaxExpandedBytes.
inline constexpr uint64_t kMlaMaxExpandedBytes = uint64_t{1} << 30;
bool mla_prefers_absorbed(const MlaDims& dims, int64_t ctx, int64_t tokens);

// out[tokens, H] = MLA(x[tokens, H]) for the normed layer input x of one sequence whose earlier `ctx`
// positions are in `cached` [ctx, latent_width] (may be null when ctx == 0). Token i sits at position
// ctx + i and attends to positions 0..ctx+i. Writes this call's latent rows to new_latent
// [tokens, latent_width] for the caller to append to its cache. out and new_latent must not overlap x.
// Parallel over heads on ThreadPool::global(): do not call from inside its parallel_for.
void mla_forward(const MlaDims& dims, const MlaWeights& w, const float* x, int64_t tokens, const float* cached,
                 int64_t ctx, float* out, float* new_latent, MlaPath path = MlaPath::kAuto);

}  // namespace kimirt::cpu
