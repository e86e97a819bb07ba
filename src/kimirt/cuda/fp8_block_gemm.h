// FP8 block-scale GEMM of our own (Hopper, sm_90a): y = dequant(xq) · dequant(wq)ᵀ with E4M3 activations
// under 1×128 per-token-group scales and E4M3 weights under 128×128 block scales, fp32 accumulation, BF16 y.
// Operands and scales in the layouts gemm_lt.h documents for GemmLt::linear_fp8 (quantize_fp8.h makes
// them), so either path takes the same tensors; rows M..m_pad-1 of y are never written (no scratch needed).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

struct Fp8BlockGemmConfig {
  // 1, or 2 for pairs of blocks that share the activation tile (TMA multicast; needs an even number of
  // 128-column blocks), or 0 for fp8_block_gemm_cluster's choice.
  int cluster = 0;
  // K blocks each consumer warpgroup keeps in flight on the tensor cores: 1 (wait, then promote) or 2
  // (the next block's wgmmas issued before this one is promoted); 0 for 2.
  int in_flight = 0;
};

// xq [m_pad, k] E4M3, x_scales [k / 128][m_pad] (m_pad = fp8_pad_m(m)); wq [n, k] E4M3,
// w_scales [ceil(n / 128)][fp8_w_scale_cols(k)]; y [m, n] BF16 with row stride ldy. n and ldy multiples of 8,
// k of 128, each up to 2^30; xq, wq, y and both scale tensors 16-byte aligned. `max_blocks` bounds the
// persistent grid (the SM count; fewer for tests of the tile loop). Throws kimirt::Error naming the field on
// bad arguments.
void fp8_block_gemm(cudaStream_t stream, const uint8_t* xq, const float* x_scales, const uint8_t* wq,
                    const float* w_scales, __nv_bfloat16* y, int64_t ldy, int64_t m, int64_t n, int64_t k,
                    int max_blocks, Fp8BlockGemmConfig config = {});

// The cluster size fp8_block_gemm picks for an [m, n] output when asked for 0.
int fp8_block_gemm_cluster(int64_t m, int64_t n);
// The grid fp8_block_gemm launches for an [m, n] output under `config`: one block per tile (pair of tiles
// in clusters of 2) up to max_blocks, and in clusters no more than fit on the current device at once.
int fp8_block_gemm_blocks(int64_t m, int64_t n, int max_blocks, Fp8BlockGemmConfig config = {});

}  // namespace kimirt::cuda
