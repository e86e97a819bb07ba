// E4M3 quantization kernels: a half-warp per 4 rows of a 128-wide activation group, one block per 128×128
// weight block.
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/fp8_group.cuh"
#include "kimirt/cuda/gemm_lt.h"
#include "kimirt/cuda/quantize_fp8.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

// Half-warp h of the grid handles kActRows consecutive rows of one 128-wide group (group-major: the tasks
// (group, row) in that order, h taking tasks kActRows·h ..; m_pad is a multiple of 4, so they never straddle
// two groups); its lane l holds inputs 8l..8l+7 of each row. All the rows' 16-byte loads are issued before
// the first reduction: with one row per half-warp (one load per thread in flight) this ran at 0.66 of the copy
// bandwidth at [4096, 7168]; a warp per group at 0.42, a warp loading 8 groups before reducing any at 0.40,
// the half-warps in row-major order at 0.64 (PERF.md, 2026-11-30). The codes are converted two per
// instruction (quantize_group8, as glu_fp8's). Past the last task a half-warp still takes part in the other
// half's shuffles (quantize_group8 reduces over the whole warp's mask), on zeros, and stores nothing.
constexpr int kActRows = 4;
static_assert(kActRows <= 16 && 4 % kActRows == 0, "a half-warp's rows never straddle a group (m_pad % 4 == 0)");

__global__ void quantize_act_kernel(const bf16* __restrict__ x, int64_t ldx, int64_t m, int64_t m_pad, int64_t k,
                                    uint8_t* __restrict__ xq, float* __restrict__ scales) {
  // 32-bit index math: the launcher bounds the tasks.
  const uint32_t task0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 4) * kActRows;
  const int lane = threadIdx.x & 15;
  const bool live = task0 < static_cast<uint32_t>(m_pad * (k / 128));
  const int64_t group = live ? task0 / static_cast<uint32_t>(m_pad) : 0;
  const int64_t row0 = live ? task0 % static_cast<uint32_t>(m_pad) : 0;
  uint4 raw[kActRows];
#pragma unroll
  for (int i = 0; i < kActRows; ++i) {
    raw[i] = make_uint4(0, 0, 0, 0);  // zeros quantize to code 0 under scale 1: the padding rows' contents
    if (live && row0 + i < m) raw[i] = detail::load16(x + (row0 + i) * ldx + group * 128 + lane * 8);
  }
  uint2 codes[kActRows];
  float scale[kActRows];
#pragma unroll
  for (int i = 0; i < kActRows; ++i) {
    float v[8];
    detail::unpack8(raw[i], v);
    codes[i] = detail::quantize_group8(v, &scale[i]);
  }
  if (!live) return;
#pragma unroll
  for (int i = 0; i < kActRows; ++i) *reinterpret_cast<uint2*>(xq + (row0 + i) * k + group * 128 + lane * 8) = codes[i];
  // The rows' scales are adjacent (one column of the group): lane i stores row i's.
  float mine = scale[0];
#pragma unroll
  for (int i = 1; i < kActRows; ++i) mine = lane == i ? scale[i] : mine;
  if (lane < kActRows) scales[group * m_pad + row0 + lane] = mine;
}

// One block of 256 threads per 128×128 weight block; thread t covers row t / 2 of the block, 64 columns.
__global__ void quantize_weight_kernel(const bf16* __restrict__ w, int64_t n, int64_t k, uint8_t* __restrict__ wq,
                                       float* __restrict__ scales, int64_t scale_cols) {
  __shared__ float red[32];
  const int64_t bn = blockIdx.y, bk = blockIdx.x;
  const int64_t row = bn * 128 + threadIdx.x / 2;
  const int64_t col0 = bk * 128 + (threadIdx.x % 2) * 64;
  const bool valid = row < n;
  float amax = 0.0f;
  if (valid) {
    for (int j = 0; j < 64; j += 8) {
      float f[8];
      detail::unpack8(detail::load16(w + row * k + col0 + j), f);
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[i]));
    }
  }
  amax = detail::warp_max(amax);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
  __syncthreads();
  float block_amax = 0.0f;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) block_amax = fmaxf(block_amax, red[i]);
  const float scale = block_amax > 0.0f ? block_amax / 448.0f : 1.0f;
  if (threadIdx.x == 0) {
    scales[bn * scale_cols + bk] = scale;
    if (bk == gridDim.x - 1) {
      for (int64_t c = gridDim.x; c < scale_cols; ++c) scales[bn * scale_cols + c] = 1.0f;
    }
  }
  if (!valid) return;
  for (int j = 0; j < 64; j += 8) {
    float f[8];
    detail::unpack8(detail::load16(w + row * k + col0 + j), f);
    uint8_t q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = detail::e4m3(f[i] / scale);
    *reinterpret_cast<uint2*>(wq + row * k + col0 + j) = *reinterpret_cast<const uint2*>(q);
  }
}

}  // namespace

void quantize_fp8_act(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, int64_t m, int64_t k, uint8_t* xq,
                      float* scales) {
  KIMIRT_CUDA_REQUIRE(m >= 0 && k > 0 && k % 128 == 0, "quantize_fp8_act: k ", k,
                      " must be a positive multiple of 128 (m ", m, ")");
  KIMIRT_CUDA_REQUIRE(ldx >= k && ldx % 8 == 0, "quantize_fp8_act: row stride ", ldx, " must be >= k ", k,
                      " and a multiple of 8");
  if (m == 0) return;
  KIMIRT_CUDA_REQUIRE(x && xq && scales, "quantize_fp8_act: null pointer");
  KIMIRT_CUDA_REQUIRE(detail::aligned16(x) && (reinterpret_cast<uintptr_t>(xq) & 7u) == 0,
                      "quantize_fp8_act: x must be 16-byte and xq 8-byte aligned");
  const int64_t m_pad = fp8_pad_m(m);
  const int64_t tasks = m_pad * (k / 128);  // (group, row) pairs, kActRows per half-warp
  const int threads = 256;
  const int64_t blocks = (tasks / kActRows * 16 + threads - 1) / threads;
  KIMIRT_CUDA_REQUIRE(tasks < (1ll << 30), "quantize_fp8_act: m ", m, " x k ", k, " too large");
  quantize_act_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(x, ldx, m, m_pad, k, xq, scales);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

void quantize_fp8_weight(cudaStream_t stream, const __nv_bfloat16* w, int64_t n, int64_t k, uint8_t* wq,
                         float* scales) {
  KIMIRT_CUDA_REQUIRE(n > 0 && k > 0 && k % 128 == 0, "quantize_fp8_weight: k ", k,
                      " must be a positive multiple of 128 (n ", n, ")");
  KIMIRT_CUDA_REQUIRE(w && wq && scales, "quantize_fp8_weight: null pointer");
  KIMIRT_CUDA_REQUIRE(detail::aligned16(w) && (reinterpret_cast<uintptr_t>(wq) & 7u) == 0,
                      "quantize_fp8_weight: w must be 16-byte and wq 8-byte aligned");
  KIMIRT_CUDA_REQUIRE((n + 127) / 128 <= 65535 && k / 128 < (1ll << 31), "quantize_fp8_weight: n ", n, " x k ", k,
                      " has too many 128 x 128 blocks for the grid (n up to 65535 x 128)");
  const dim3 grid(static_cast<unsigned>(k / 128), static_cast<unsigned>((n + 127) / 128));
  quantize_weight_kernel<<<grid, 256, 0, stream>>>(w, n, k, wq, scales, fp8_w_scale_cols(k));
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace kimirt::cuda
