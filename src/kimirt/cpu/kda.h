// The whole KDA (Kimi Delta Attention) mixer of one sequence (§3.4): projections, short conv + SiLU,
// q/k L2 norm, forget gate and β, the delta-rule recurrence (chunked for prefill, token-wise for decode),
// the gated output norm and o_proj. Covers both families: Kimi Linear (softplus gate, low-rank output
// gate) and Kimi K3 (bounded sigmoid gate, full-rank output gate).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kimirt::cpu {

struct KdaDims {
  int64_t hidden = 0;                     // H
  int64_t num_heads = 0;                  // linear_attn_config.num_heads
  int64_t head_dim = 0;                   // linear_attn_config.head_dim (K = V); D = num_heads × head_dim
  int64_t conv_width = 4;                 // short_conv_kernel_size
  std::optional<float> gate_lower_bound;  // K3 gate_lower_bound (−5); absent: Kimi Linear softplus gate
  bool full_rank_output_gate = false;     // use_full_rank_gate: g_proj instead of g_b_proj ∘ g_a_proj
  float rms_norm_eps = 1e-5f;             // of the gated output norm
  int64_t chunk_size = 64;

  int64_t channels() const { return num_heads * head_dim; }
};

// Throws an Error naming the offending field.
void validate(const KdaDims& dims);

// Weights in checkpoint layout ([out, in]), fp32. The low-rank ranks equal head_dim (f_a/g_a produce
// head_dim values), as in the checkpoints.
struct KdaWeights {
  const float* q_proj = nullptr;    // [D, H]
  const float* k_proj = nullptr;    // [D, H]
  const float* v_proj = nullptr;    // [D, H]
  const float* q_conv = nullptr;    // [D, W]  (q_conv1d.weight [D, 1, W])
  const float* k_conv = nullptr;    // [D, W]
  const float* v_conv = nullptr;    // [D, W]
  const float* f_a_proj = nullptr;  // [head_dim, H]
  const float* f_b_proj = nullptr;  // [D, head_dim]
  const float* b_proj = nullptr;    // [num_heads, H]
  const float* a_log = nullptr;     // [num_heads] (the first num_heads of a padded A_log)
  const float* dt_bias = nullptr;   // [D]
  const float* g_proj = nullptr;    // [D, H]         full-rank output gate (K3)
  const float* g_a_proj = nullptr;  // [head_dim, H]  low-rank output gate, applied first (Kimi Linear)
  const float* g_b_proj = nullptr;  // [D, head_dim]  then this
  const float* o_norm = nullptr;    // [head_dim]
  const float* o_proj = nullptr;    // [H, D]
};

// Per-sequence state carried between calls; zeros at sequence start.
struct KdaState {
  std::vector<float> conv_q;     // [D, W-1]: last W-1 pre-conv q inputs per channel, oldest first
  std::vector<float> conv_k;     // [D, W-1]
  std::vector<float> conv_v;     // [D, W-1]
  std::vector<float> recurrent;  // [num_heads, K, V], fp32

  static KdaState zeros(const KdaDims& dims);
};

enum class KdaMode { kAuto, kRecurrent, kChunked };

// out[tokens, H] = KDA(x[tokens, H]) for the normed layer input x of one sequence, continuing from and
// updating `state`. kAuto: token recurrence for a single token (decode), chunked form otherwise.
// The state's sizes are checked against dims before anything is computed. out must not overlap x.
void kda_forward(const KdaDims& dims, const KdaWeights& w, const float* x, int64_t tokens, KdaState& state, float* out,
                 KdaMode mode = KdaMode::kAuto);

}  // namespace kimirt::cpu
