// The KDA gated delta rule (§3.4 steps 6-7) over one sequence, per head, fp32. Two forms of the same
// math: the token recurrence (decode) and the chunked form (prefill). Both start from a given state and
// leave the final state in it.
//
// Per head, with state S ∈ ℝ^{K×V}:
//   S ← Diag(exp(g_t)) · S
//   S ← S + β_t · k_t ⊗ (v_t − Sᵀ k_t)
//   o_t = Sᵀ q_t
#pragma once

#include <cstdint>

namespace kimirt::cpu {

// Inputs of one sequence. q, k, v, g [tokens, heads, head_dim]; beta [tokens, heads].
// q must already be L2-normalized and scaled by head_dim^-½, k L2-normalized, g the log-decay (≤ 0),
// beta in (0, 1). Key and value head dims are equal (head_dim), as in both model families.
struct KdaSequence {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* g = nullptr;
  const float* beta = nullptr;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
};

// Both functions split the heads over ThreadPool::global(); do not call them from inside its parallel_for.

// Token by token. state [heads, K, V] (row d of a head's S is key channel d); out [tokens, heads, V].
void kda_recurrent(const KdaSequence& seq, float* state, float* out);

// Chunks of `chunk_size` tokens (the last may be shorter). Within a chunk, with Γ_i = Σ_{r≤i} g_r (per
// channel) and S the state at the chunk start:
//   A[i, j] = β_i Σ_d k_i[d] k_j[d] exp(Γ_i[d] − Γ_j[d])        (j < i)
//   u_i     = β_i (v_i − Sᵀ(k_i ⊙ exp Γ_i)) − Σ_{j<i} A[i, j] u_j  (forward substitution: u = (I + A)⁻¹ rhs)
//   o_i     = Sᵀ(q_i ⊙ exp Γ_i) + Σ_{j≤i} (Σ_d q_i[d] k_j[d] exp(Γ_i[d] − Γ_j[d])) u_j
//   S      ← Diag(exp Γ_last) S + Σ_j (k_j ⊙ exp(Γ_last − Γ_j)) u_jᵀ
// Every exponent is ≤ 0, so the unbounded Kimi Linear gate cannot overflow; log-decays below −128 (−∞ included)
// count as −128, whose decay is 0 in float as theirs is; the cumulative log-decays are summed in double.
void kda_chunked(const KdaSequence& seq, float* state, float* out, int64_t chunk_size = 64);

}  // namespace kimirt::cpu
