// KDA per-channel forget gate (log-decay g ≤ 0) and update strength β (§3.4 steps 4-5), fp32.
#pragma once

#include <cstdint>
#include <optional>

namespace kimirt::cpu {

// For token t, head h, channel d, with z = f[t, h, d] + dt_bias[h, d]:
//   lower_bound λ set (Kimi K3, gate_lower_bound):  g = λ · σ(exp(A_log[h]) · z)       ∈ (λ, 0)
//   lower_bound absent (Kimi Linear):               g = −exp(A_log[h]) · softplus(z)   ∈ (−∞, 0]
// f and g [tokens, heads, head_dim] (g may equal f); a_log [heads]; dt_bias [heads, head_dim].
void kda_forget_gate(const float* f, const float* a_log, const float* dt_bias, std::optional<float> lower_bound,
                     int64_t tokens, int64_t heads, int64_t head_dim, float* g);

// β = σ(b) element-wise, [tokens, heads] (beta may equal b).
void kda_beta(const float* b, int64_t n, float* beta);

}  // namespace kimirt::cpu
