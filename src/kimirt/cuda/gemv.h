// Skinny GEMM for decode batches: y[M, N] = x[M, K] · W[N, K]ᵀ with M ≤ 16 and BF16 weights. Reading W
// once is the whole cost, so the kernels stream W at full bandwidth:
//   rows (M ≤ 4, one batch entry; chosen for M ≤ 2): a warp reads whole rows of W, 512 contiguous bytes per
//     load, fp32 FMAs, K split over the warps of a block when N is small (one launch, no workspace);
//   mma (otherwise): each warp owns 16 rows of W and runs them through tensor-core MMAs with the (padded)
//     tokens as the narrow dimension; K is split across warps and, for small N, across blocks (partial sums
//     then reduced by a second tiny kernel).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kimirt/cuda/gemm_types.h"

namespace kimirt::cuda {

inline constexpr int64_t kSkinnyMaxM = 16;

struct SkinnyGemmArgs {
  const __nv_bfloat16* x = nullptr;  // [m, k], row stride ldx
  int64_t ldx = 0;
  const __nv_bfloat16* w = nullptr;  // [n, k], row stride ldw
  int64_t ldw = 0;
  void* y = nullptr;  // [m, n], row stride ldy, BF16 or fp32
  OutType y_type = OutType::kBF16;
  int64_t ldy = 0;
  int64_t m = 0, n = 0, k = 0;
  float beta = 0.0f;  // 0 or 1 (accumulate into y)
  // Strided batches (the per-head MLA projections): entry b uses x + b·stride_x, w + b·stride_w,
  // y + b·stride_y (elements).
  int64_t batch = 1;
  int64_t stride_x = 0, stride_w = 0, stride_y = 0;
  // Optional output gate (BF16 y, beta 0): y = bf16(bf16(x · Wᵀ) · σ(gate)), gate laid out as y (ldy,
  // stride_y): bit for bit what sigmoid_gate_mul (mla_cache.h) after the plain product gives, without its
  // launch (the MLA output gate fused into W_UV).
  const __nv_bfloat16* gate = nullptr;
  // Optional RMSNorm of x's rows fused ahead of the product (mma kernel only, K not split over blocks):
  // y = rms(x)⁻¹ · (bf16(x ⊙ x_norm) · Wᵀ), rms(x) = sqrt(mean(x²) + x_norm_eps) over the row's k values. The
  // unfused path, rms_norm then the product, rounds bf16(x · rms⁻¹) ⊙ x_norm instead: the two differ by
  // the rounding of one operand (a bf16 step per term), not by a formula. Saves the norm's launch where the
  // norm's output feeds only this product (the q_a norm before q_b_proj in an MLA decode step).
  const __nv_bfloat16* x_norm = nullptr;  // [k], 16-byte aligned
  float x_norm_eps = 1e-6f;
};

// Which kernel and split a call uses; skinny_gemm picks it from the shape, the dispatch table (measured)
// or a benchmark may force one.
struct SkinnyConfig {
  enum class Kernel { kAuto, kRows, kMma };
  Kernel kernel = Kernel::kAuto;
  int rows_per_warp = 2;  // rows kernel: 1 or 2
  int splits = 1;         // rows kernel: warps per row group along K (1, 2, 4, 8)
  // Rows kernel with m = 1, 2 rows per warp, one split: a persistent grid of at most this many 1024-thread
  // blocks, each alone on its SM (its registers fill it; were they to fit twice, it reserves shared memory), so that
  // the GEMV keeps that many SMs and leaves the others to a kernel running beside it (0: one warp per row group, blocks
  // on every SM).
  int max_blocks = 0;
};

// Whether the skinny kernel can run this call (m ≤ 16, n and k below 2^30 (the kernels' index arithmetic is
// 32-bit), k % 32 == 0, row and batch strides of x and w multiples of 8 elements, x, w and x_norm 16-byte
// aligned, a gate only with BF16 y and beta 0); the dispatcher falls back to cuBLASLt otherwise.
bool skinny_gemm_supported(const SkinnyGemmArgs& a);

// Bytes of fp32 partial sums the split-K path may need for this shape on `sm_count` SMs.
uint64_t skinny_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int sm_count, int64_t batch = 1);

// Runs the kernel (throws kimirt::Error naming the field when !skinny_gemm_supported). `workspace` may be
// null; the split over blocks is then limited to what needs none.
void skinny_gemm(cudaStream_t stream, const SkinnyGemmArgs& a, void* workspace, uint64_t workspace_bytes, int sm_count);
// The same with the kernel (and its split) forced; the rows kernel needs m ≤ 4 and batch 1 and takes no x_norm.
void skinny_gemm(cudaStream_t stream, const SkinnyGemmArgs& a, void* workspace, uint64_t workspace_bytes, int sm_count,
                 const SkinnyConfig& config);
// Blocks of the capped grid (SkinnyConfig::max_blocks) that share one SM of the current device, as launched:
// 1 is its contract (a launch throws otherwise).
int skinny_capped_blocks_per_sm(OutType y_type);
// What skinny_gemm would choose for this call.
SkinnyConfig skinny_gemm_config(const SkinnyGemmArgs& a, int sm_count);

}  // namespace kimirt::cuda
