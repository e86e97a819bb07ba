// RMSNorm on BF16 rows (§3.2): fp32 statistics, y = w ⊙ bf16(x · (mean(x²) + ε)^-½), the weight applied
// after the downcast as the bf16 reference model does. The fused variant first adds a residual and keeps
// the bf16 sum (the residual stream), then normalizes that sum.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

// out[r, :] = RMSNorm(x[r, :]; w). dim ≤ 16384 and a multiple of 8; strides (elements) multiples of 8;
// pointers 16-byte aligned. out may equal x.
void rms_norm(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, __nv_bfloat16* out,
              int64_t ld_out, int64_t rows, int64_t dim, float eps);

// sum = bf16(x + residual) (written to sum_out unless null; may equal x or residual), out = RMSNorm(sum).
void add_rms_norm(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* residual,
                  int64_t ld_res, __nv_bfloat16* sum_out, int64_t ld_sum, const __nv_bfloat16* w, __nv_bfloat16* out,
                  int64_t ld_out, int64_t rows, int64_t dim, float eps);

// The same two norms with their output quantized for an FP8 block-scale GEMM (gemm_lt.h's layouts): xq
// [round_up(rows, 4), dim] E4M3 and scales [dim / 128][round_up(rows, 4)] hold exactly what quantize_fp8_act
// makes of the bf16 output rms_norm / add_rms_norm would write (padding rows: zeros, scale 1), without that
// output's round trip through memory. dim a multiple of 128; xq 16-byte aligned.
void rms_norm_fp8(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, uint8_t* xq,
                  float* scales, int64_t rows, int64_t dim, float eps);
void add_rms_norm_fp8(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* residual,
                      int64_t ld_res, __nv_bfloat16* sum_out, int64_t ld_sum, const __nv_bfloat16* w, uint8_t* xq,
                      float* scales, int64_t rows, int64_t dim, float eps);

// Gated RMSNorm of the KDA output (§3.4 step 8), all fp32 with one final rounding (FLA's fused form):
// out[r, h, :] = x[r, h, :] · (mean(x[r, h, :]²) + ε)^-½ ⊙ w ⊙ σ(gate[r, h, :]). x is BF16 or fp32
// [rows, heads, head_dim]; head_dim ∈ {128, 256, 512}; w fp32 [head_dim] shared by all heads. Row strides
// in elements (multiples of 8); out may equal x when x is BF16.
void rms_norm_gated(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* gate,
                    int64_t ld_gate, const float* w, __nv_bfloat16* out, int64_t ld_out, int64_t rows, int64_t heads,
                    int64_t head_dim, float eps);
void rms_norm_gated(cudaStream_t stream, const float* x, int64_t ldx, const __nv_bfloat16* gate, int64_t ld_gate,
                    const float* w, __nv_bfloat16* out, int64_t ld_out, int64_t rows, int64_t heads, int64_t head_dim,
                    float eps);

}  // namespace kimirt::cuda
