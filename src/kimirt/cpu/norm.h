// Row normalizations of the model, fp32 (§3.2, §3.4 steps 3 and 8). Sums of squares are accumulated in
// double: the reference is fp32 PyTorch, and a more exact sum keeps us within its own rounding noise.
#pragma once

#include <cstdint>

namespace kimirt::cpu {

// RMSNorm per row: out = x · (mean(x²) + eps)^-½ ⊙ w, x and out [rows, dim] (out may equal x), w [dim].
void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t dim, float eps);

// RMSNorm without a weight (the AttnRes keys): out = x · (mean(x²) + eps)^-½. out may equal x.
void rms_normalize(const float* x, float* out, int64_t rows, int64_t dim, float eps);

// Gated RMSNorm of the KDA output (§3.4 step 8): for each row and head h,
// out[h, :] = x[h, :] · (mean(x[h, :]²) + eps)^-½ ⊙ w ⊙ σ(gate[h, :]).
// x, gate, out [rows, heads, head_dim] (out may equal x); w [head_dim], shared by all heads.
void rms_norm_gated(const float* x, const float* gate, const float* w, float* out, int64_t rows, int64_t heads,
                    int64_t head_dim, float eps);

// L2 normalization of each length-dim vector: out = x · (Σx² + eps)^-½ (FLA's l2norm; eps 1e-6 for KDA
// q and k), then times `scale`. x and out [rows, dim] (out may equal x).
void l2_normalize(const float* x, float* out, int64_t rows, int64_t dim, float eps, float scale = 1.0f);

// Refuses an eps that is negative or not finite, naming `op`: every norm here takes eps inside the root.
void check_norm_eps(const char* op, float eps);

}  // namespace kimirt::cpu
