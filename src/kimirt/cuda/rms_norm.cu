// RMSNorm kernels: one block per row, the row brought into shared memory by a bulk copy, and 16 or 32
// lanes per (row, head) for the gated per-head norm.
#include <algorithm>

#include "kimirt/cuda/async_pipeline.cuh"
#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/fp8_group.cuh"
#include "kimirt/cuda/gemm_lt.h"
#include "kimirt/cuda/kernel_attr.h"
#include "kimirt/cuda/rms_norm.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

// One block per row. Thread 0 hands the row (and the residual row) to the bulk-copy engine, which writes
// it into shared memory: the block's threads never stall issuing loads, and at 14 KiB per K3 row a dozen
// rows per SM are in flight. Then two passes over shared memory (sum of squares, then normalize).
constexpr int kNormThreads = 128;
// The FP8 output's block: its second pass quantizes per 128-group (shuffles, a scale per group, a refined
// product per value), so a row gets more threads and fewer rounds. 256 measured within 2% of the best (224) of
// 128 / 224 / 256 / 512; two rows per block, the second's copy landing while the first is computed, ran 10%
// slower (PERF.md, 2026-11-30, machine CK).
constexpr int kNormFp8Threads = 256;

// Where the normalized row goes: bf16 `out`, or (an FP8 GEMM's input) E4M3 codes `xq` [rows_pad, dim] and
// scales [dim / 128][rows_pad] of the bf16 values that `out` would hold, quantized as quantize_fp8_act does.
// The blocks of rows rows..rows_pad-1 (read by the FP8 GEMM) write zeros under scale 1.
struct NormOut {
  bf16* out = nullptr;
  int64_t ld_out = 0;
  uint8_t* xq = nullptr;
  float* scales = nullptr;
  int64_t rows = 0, rows_pad = 0;  // the rows normalized; with the padding the FP8 GEMM reads (rows for bf16)
};

NormOut bf16_out(bf16* out, int64_t ld_out, int64_t rows) {
  NormOut o;
  o.out = out;
  o.ld_out = ld_out;
  o.rows = o.rows_pad = rows;
  return o;
}

// The norm of 8 stored values (detail::normalize8 on their fp32 form).
__device__ __forceinline__ uint4 normalize8(const uint4& x, float rs, const uint4& w) {
  float v[8];
  detail::unpack8(x, v);
  return detail::normalize8(v, rs, w);
}

template <bool kFp8, int kThreads>
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const bf16* x, int64_t ldx, const bf16* res, int64_t ld_res, bf16* sum_out, int64_t ld_sum,
                    const bf16* __restrict__ w, const NormOut o, int dim, float eps) {
  extern __shared__ uint4 row_s[];  // [vectors] x, then [vectors] residual
  __shared__ __align__(8) uint64_t bar;
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int vectors = dim / 8;
  const uint32_t bar_addr = detail::smem_addr(&bar);
  if constexpr (kFp8) {
    if (row >= o.rows) {
      // A padding row: zeros and scale 1, what quantize_fp8_act writes there (16 threads per 128-group).
      for (int vi = threadIdx.x; vi < vectors; vi += kThreads) {
        *reinterpret_cast<uint2*>(o.xq + row * dim + vi * 8) = uint2{0, 0};
        if (vi % 16 == 0) o.scales[(vi / 16) * o.rows_pad + row] = 1.0f;
      }
      return;
    }
  }
  if (threadIdx.x == 0) {
    detail::mbar_init(bar_addr, 1);
    detail::mbar_init_fence();
    const uint32_t bytes = static_cast<uint32_t>(vectors) * 16;
    detail::mbar_expect_tx(bar_addr, res ? 2 * bytes : bytes);
    detail::bulk_load(detail::smem_addr(row_s), x + row * ldx, bytes, bar_addr);
    if (res) detail::bulk_load(detail::smem_addr(row_s + vectors), res + row * ld_res, bytes, bar_addr);
  }
  __syncthreads();
  detail::mbar_wait(bar_addr, 0);
  // The sum of squares in the bf16 kernel's order at every block size: the first kNormThreads threads, each
  // over vectors tid, tid + kNormThreads, ...; the other warps' zeros leave block_sum's tree as it is with
  // kNormThreads. So the FP8 output's rs is the bf16 output's to the bit, as rms_norm.h promises (the 256-thread
  // FP8 kernel's own stride summed in another order: an ulp apart in rs, now and then a bf16 output apart).
  float ss = 0.0f;
  for (int vi = threadIdx.x < kNormThreads ? threadIdx.x : vectors; vi < vectors; vi += kNormThreads) {
    float v[8];
    detail::unpack8(row_s[vi], v);
    if (res) {
      float r[8];
      detail::unpack8(row_s[vectors + vi], r);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] += r[j];
      const uint4 packed = detail::pack8(v);
      detail::unpack8(packed, v);  // the sum as stored, in bf16
      row_s[vi] = packed;          // read back in the second pass, after block_sum's barriers
      if (sum_out) detail::store16(sum_out + row * ld_sum + vi * 8, packed);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
  }
  const float total = detail::block_sum(ss, scratch);
  const float rs = 1.0f / sqrtf(total / static_cast<float>(dim) + eps);
  if constexpr (!kFp8) {
    for (int vi = threadIdx.x; vi < vectors; vi += kThreads)
      detail::store16(o.out + row * o.ld_out + vi * 8, normalize8(row_s[vi], rs, detail::ldg16(w + vi * 8)));
  } else {
    // A quarter-warp holds one 128-group, lane l its vectors l and l + 8 (16 values: the group's scalar work
    // spread over twice the values of a half-warp's 8; the 8 lanes' loads of one vector are contiguous, so
    // shared memory serves them without conflicts). Every thread runs every round, so that all lanes of a warp
    // take part in the groups' shuffles (dim is a multiple of 128, kThreads of 32).
    const int slots = vectors / 2;  // (group, lane) pairs
    uint8_t* xq_row = o.xq + row * dim;
    float* scale_col = o.scales + row;
    for (int base = 0; base < slots; base += kThreads) {
      const int slot = base + static_cast<int>(threadIdx.x);
      const bool live = slot < slots;
      const int v0 = (slot / 8) * 16 + slot % 8, v1 = v0 + 8;
      float y[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) y[j] = 0.0f;
      if (live) {
        float a[8], b[8];
        detail::unpack8(normalize8(row_s[v0], rs, detail::ldg16(w + v0 * 8)), a);
        detail::unpack8(normalize8(row_s[v1], rs, detail::ldg16(w + v1 * 8)), b);
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = a[j], y[8 + j] = b[j];
      }
      float scale;
      uint32_t codes[4];
      detail::quantize_group(y, &scale, codes);
      if (!live) continue;
      *reinterpret_cast<uint2*>(xq_row + v0 * 8) = uint2{codes[0], codes[1]};
      *reinterpret_cast<uint2*>(xq_row + v1 * 8) = uint2{codes[2], codes[3]};
      if (slot % 8 == 0) scale_col[(slot / 8) * o.rows_pad] = scale;
    }
  }
}
static_assert(kNormFp8Threads % 32 == 0 && kNormFp8Threads >= kNormThreads,
              "whole warps: 4 groups per warp; the bf16 kernel's threads for the sum of squares");

__device__ __forceinline__ void load8(const bf16* p, float (&f)[8]) { detail::unpack8(detail::ldcs16(p), f); }
__device__ __forceinline__ void load8(const float* p, float (&f)[8]) {
  const float4 a = __ldcs(reinterpret_cast<const float4*>(p));
  const float4 b = __ldcs(reinterpret_cast<const float4*>(p) + 1);
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

// Lanes per head L = min(32, HD / 8); lane j of a head holds the 8-value vectors j, j + L, ... (NV of
// them), so each load is 16 bytes; x, gate and w are all requested before the reduction.
template <int HD, typename InT>
__global__ void __launch_bounds__(256)
    rms_norm_gated_kernel(const InT* x, int64_t ldx, const bf16* __restrict__ gate, int64_t ld_gate,
                          const float* __restrict__ w, bf16* out, int64_t ld_out, int64_t rows, int heads, float eps) {
  constexpr int L = HD / 8 < 32 ? HD / 8 : 32;
  constexpr int NV = HD / 8 / L;
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / L;
  const int j = threadIdx.x % L;
  const bool valid = item < rows * heads;
  const int64_t row = valid ? item / heads : 0;
  const int head = valid ? static_cast<int>(item % heads) : 0;
  float v[NV][8], g[NV][8];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = head * HD + (j + i * L) * 8;
    load8(x + row * ldx + c, v[i]);
    load8(gate + row * ld_gate + c, g[i]);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[i][e] * v[i][e];
  }
#pragma unroll
  for (int o = L / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(HD) + eps);
  if (!valid) return;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c = (j + i * L) * 8;
    const float4 w0 = __ldg(reinterpret_cast<const float4*>(w + c));
    const float4 w1 = __ldg(reinterpret_cast<const float4*>(w + c) + 1);
    const float wf[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    float y[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = v[i][e] * rs * wf[e] * detail::sigmoid_fast(g[i][e]);
    detail::store16(out + row * ld_out + head * HD + c, detail::pack8(y));
  }
}

void check_rows(const char* op, const void* x, int64_t ldx, const void* res, int64_t ld_res, const void* sum,
                int64_t ld_sum, const void* w, const void* out, int64_t ld_out, int64_t rows, int64_t dim) {
  KIMIRT_CUDA_REQUIRE(rows >= 0 && rows < (1ll << 31), op, ": row count ", rows);
  KIMIRT_CUDA_REQUIRE(dim > 0 && dim % 8 == 0 && dim <= 16384, op, ": dim ", dim,
                      " must be a multiple of 8 in [8, 16384]");
  KIMIRT_CUDA_REQUIRE(ldx >= dim && ldx % 8 == 0 && ld_out >= dim && ld_out % 8 == 0, op, ": row strides (x ", ldx,
                      ", out ", ld_out, ") must be >= dim ", dim, " and multiples of 8");
  KIMIRT_CUDA_REQUIRE(x && w && out && detail::aligned16(x) && detail::aligned16(w) && detail::aligned16(out), op,
                      ": x, w and out must be non-null and 16-byte aligned");
  if (res) {
    KIMIRT_CUDA_REQUIRE(ld_res >= dim && ld_res % 8 == 0 && detail::aligned16(res), op, ": residual stride ", ld_res,
                        " must be >= dim and a multiple of 8, residual 16-byte aligned");
  }
  if (sum) {
    KIMIRT_CUDA_REQUIRE(ld_sum >= dim && ld_sum % 8 == 0 && detail::aligned16(sum), op, ": sum stride ", ld_sum,
                        " must be >= dim and a multiple of 8, sum_out 16-byte aligned");
  }
}

void launch_rms(cudaStream_t stream, const bf16* x, int64_t ldx, const bf16* res, int64_t ld_res, bf16* sum,
                int64_t ld_sum, const bf16* w, const NormOut& o, int64_t dim, float eps) {
  check_norm_eps(res ? "add_rms_norm" : "rms_norm", "eps", eps);
  const bool fp8 = o.xq != nullptr;
  const int64_t blocks = fp8 ? o.rows_pad : o.rows;
  if (blocks == 0) return;
  const int smem = static_cast<int>(dim / 8 * 16 * (res ? 2 : 1));
  const auto kernel = fp8 ? rms_norm_kernel<true, kNormFp8Threads> : rms_norm_kernel<false, kNormThreads>;
  ensure_dynamic_smem(reinterpret_cast<const void*>(kernel), 2 * 16384 * 2);
  kernel<<<static_cast<unsigned>(blocks), fp8 ? kNormFp8Threads : kNormThreads, smem, stream>>>(
      x, ldx, res, ld_res, sum, ld_sum, w, o, static_cast<int>(dim), eps);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

// The FP8 outputs' checks, then the launch (rms_norm_fp8, add_rms_norm_fp8).
void launch_rms_fp8(const char* op, cudaStream_t stream, const bf16* x, int64_t ldx, const bf16* res, int64_t ld_res,
                    bf16* sum, int64_t ld_sum, const bf16* w, uint8_t* xq, float* scales, int64_t rows, int64_t dim,
                    float eps) {
  KIMIRT_CUDA_REQUIRE(dim % 128 == 0, op, ": dim ", dim, " must be a multiple of 128 (one scale per 128 values)");
  KIMIRT_CUDA_REQUIRE(scales && (reinterpret_cast<uintptr_t>(scales) & 3u) == 0, op,
                      ": scales must be non-null and 4-byte aligned");
  check_rows(op, x, ldx, res, ld_res, sum, ld_sum, w, xq, dim, rows, dim);  // xq as the output
  KIMIRT_CUDA_REQUIRE(fp8_pad_m(rows) < (1ll << 31), op, ": row count ", rows);
  NormOut o;
  o.xq = xq;
  o.scales = scales;
  o.rows = rows;
  o.rows_pad = fp8_pad_m(rows);
  launch_rms(stream, x, ldx, res, ld_res, sum, ld_sum, w, o, dim, eps);
}

template <typename InT>
void launch_gated(cudaStream_t stream, const InT* x, int64_t ldx, const bf16* gate, int64_t ld_gate, const float* w,
                  bf16* out, int64_t ld_out, int64_t rows, int64_t heads, int64_t head_dim, float eps) {
  KIMIRT_CUDA_REQUIRE(rows >= 0 && heads > 0, "rms_norm_gated: rows ", rows, ", heads ", heads);
  check_norm_eps("rms_norm_gated", "eps", eps);
  KIMIRT_CUDA_REQUIRE(head_dim == 128 || head_dim == 256 || head_dim == 512, "rms_norm_gated: head_dim ", head_dim,
                      " must be 128, 256 or 512");
  const int64_t width = heads * head_dim;
  KIMIRT_CUDA_REQUIRE(
      ldx >= width && ld_gate >= width && ld_out >= width && ldx % 8 == 0 && ld_gate % 8 == 0 && ld_out % 8 == 0,
      "rms_norm_gated: row strides (x ", ldx, ", gate ", ld_gate, ", out ", ld_out, ") must be >= heads*head_dim ",
      width, " and multiples of 8");
  KIMIRT_CUDA_REQUIRE(x && gate && w && out && detail::aligned16(x) && detail::aligned16(gate) &&
                          detail::aligned16(w) && detail::aligned16(out),
                      "rms_norm_gated: pointers must be non-null and 16-byte aligned");
  if (rows == 0) return;
  const int64_t items = rows * heads;
  const int threads = 256;
  const int64_t lanes = head_dim == 128 ? 16 : 32;
  const int64_t blocks = (items * lanes + threads - 1) / threads;
  KIMIRT_CUDA_REQUIRE(blocks < (1ll << 31), "rms_norm_gated: too many rows ", rows);
  const unsigned b = static_cast<unsigned>(blocks);
  const int h = static_cast<int>(heads);
  if (head_dim == 128) {
    rms_norm_gated_kernel<128, InT><<<b, threads, 0, stream>>>(x, ldx, gate, ld_gate, w, out, ld_out, rows, h, eps);
  } else if (head_dim == 256) {
    rms_norm_gated_kernel<256, InT><<<b, threads, 0, stream>>>(x, ldx, gate, ld_gate, w, out, ld_out, rows, h, eps);
  } else {
    rms_norm_gated_kernel<512, InT><<<b, threads, 0, stream>>>(x, ldx, gate, ld_gate, w, out, ld_out, rows, h, eps);
  }
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rms_norm(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, __nv_bfloat16* out,
              int64_t ld_out, int64_t rows, int64_t dim, float eps) {
  check_rows("rms_norm", x, ldx, nullptr, 0, nullptr, 0, w, out, ld_out, rows, dim);
  launch_rms(stream, x, ldx, nullptr, 0, nullptr, 0, w, bf16_out(out, ld_out, rows), dim, eps);
}

void rms_norm_fp8(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, uint8_t* xq,
                  float* scales, int64_t rows, int64_t dim, float eps) {
  launch_rms_fp8("rms_norm_fp8", stream, x, ldx, nullptr, 0, nullptr, 0, w, xq, scales, rows, dim, eps);
}

void add_rms_norm_fp8(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* residual,
                      int64_t ld_res, __nv_bfloat16* sum_out, int64_t ld_sum, const __nv_bfloat16* w, uint8_t* xq,
                      float* scales, int64_t rows, int64_t dim, float eps) {
  KIMIRT_CUDA_REQUIRE(residual, "add_rms_norm_fp8: residual is null");
  launch_rms_fp8("add_rms_norm_fp8", stream, x, ldx, residual, ld_res, sum_out, ld_sum, w, xq, scales, rows, dim, eps);
}

void add_rms_norm(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* residual,
                  int64_t ld_res, __nv_bfloat16* sum_out, int64_t ld_sum, const __nv_bfloat16* w, __nv_bfloat16* out,
                  int64_t ld_out, int64_t rows, int64_t dim, float eps) {
  KIMIRT_CUDA_REQUIRE(residual, "add_rms_norm: residual is null");
  check_rows("add_rms_norm", x, ldx, residual, ld_res, sum_out, ld_sum, w, out, ld_out, rows, dim);
  launch_rms(stream, x, ldx, residual, ld_res, sum_out, ld_sum, w, bf16_out(out, ld_out, rows), dim, eps);
}

void rms_norm_gated(cudaStream_t stream, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* gate,
                    int64_t ld_gate, const float* w, __nv_bfloat16* out, int64_t ld_out, int64_t rows, int64_t heads,
                    int64_t head_dim, float eps) {
  launch_gated(stream, x, ldx, gate, ld_gate, w, out, ld_out, rows, heads, head_dim, eps);
}

void rms_norm_gated(cudaStream_t stream, const float* x, int64_t ldx, const __nv_bfloat16* gate, int64_t ld_gate,
                    const float* w, __nv_bfloat16* out, int64_t ld_out, int64_t rows, int64_t heads, int64_t head_dim,
                    float eps) {
  launch_gated(stream, x, ldx, gate, ld_gate, w, out, ld_out, rows, heads, head_dim, eps);
}

}  // namespace kimirt::cuda
