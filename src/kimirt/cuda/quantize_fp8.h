// E4M3 quantization for the FP8 block-scale GEMM (layouts in gemm_lt.h).
//   Activations: per token and per group of 128 inputs, scale = amax / 448 (1 when the group is all zero),
//   code = e4m3_satfinite(x / scale). Rows M..round_up(M, 4)-1 are written as zeros with scale 1.
//   Weights: the same per 128×128 block (a load-time conversion; checkpoints that ship FP8 blocks bring
//   their own scales, which the loader repacks to the padded layout).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

// x [m, k] (row stride ldx) -> xq [round_up(m, 4), k] contiguous, scales [k / 128][round_up(m, 4)].
// k must be a multiple of 128, ldx of 8; x 16-byte and xq 8-byte aligned.
void quantize_fp8_act(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, int64_t m, int64_t k, uint8_t* xq,
                      float* scales);

// w [n, k] contiguous -> wq [n, k], scales [ceil(n / 128)][fp8_w_scale_cols(k)] (padding columns set to 1).
// k must be a multiple of 128.
void quantize_fp8_weight(cudaStream_t stream, const __nv_bfloat16* w, int64_t n, int64_t k, uint8_t* wq, float* scales);

}  // namespace kimirt::cuda
