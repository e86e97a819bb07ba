// SiTU-GLU / SiLU-GLU kernels.
#include <algorithm>
#include <cmath>

#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/fp8_group.cuh"
#include "kimirt/cuda/situ.h"

namespace kimirt::cuda {
namespace {

using detail::bf16;

struct Act {
  bool situ;
  float beta, inv_beta, linear_beta, inv_linear_beta;
  float scale;  // β·β₂ (β without β₂): one product per value instead of two
};

// The special-function unit does the transcendentals (tanh.approx, ex2, rcp): with the IEEE tanhf / expf
// this kernel was compute-bound at a third of the memory bandwidth. Errors (~2^-11 relative from tanh) stay
// under the bf16 rounding of the output. kKind: 0 SiLU, 1 SiTU, 2 SiTU with the up-branch tanh.
template <int kKind>
__device__ __forceinline__ float glu_value_k(const Act& a, float g, float u) {
  const float sg = detail::sigmoid_fast(g);
  if constexpr (kKind == 0) {
    return g * sg * u;
  } else {
    const float t = detail::tanh_fast(g * a.inv_beta) * sg;
    const float up = kKind == 2 ? detail::tanh_fast(u * a.inv_linear_beta) : u;
    return a.scale * t * up;
  }
}

// The kKind of glu_value_k an activation takes.
__host__ __device__ __forceinline__ int glu_kind(const Act& a) { return !a.situ ? 0 : a.linear_beta > 0.0f ? 2 : 1; }

// The kind chosen at run time: the bf16 kernel streams at the copy ceiling either way. The FP8 kernel is
// instantiated per kind instead: there the special-function unit and the issue slots, not memory, set the
// pace (H200 profile, 2026-11-29: MUFU-queue and not-selected stalls), so run-time branches cost time.
__device__ __forceinline__ float glu_value(const Act& a, float g, float u) {
  const int kind = glu_kind(a);
  if (kind == 0) return glu_value_k<0>(a, g, u);
  return kind == 2 ? glu_value_k<2>(a, g, u) : glu_value_k<1>(a, g, u);
}

// Block (x, y): 256 threads over 8-value vectors of row y (blockIdx.y + y_offset).
__global__ void glu_kernel(Act a, const bf16* __restrict__ gate, const bf16* __restrict__ up, int64_t ld_in,
                           bf16* __restrict__ out, int64_t ld_out, int64_t row0, int width) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (c >= width) return;
  const int64_t r = row0 + blockIdx.y;
  float g[8], u[8], y[8];
  detail::unpack8(detail::ldcs16(gate + r * ld_in + c), g);
  detail::unpack8(detail::ldcs16(up + r * ld_in + c), u);
#pragma unroll
  for (int j = 0; j < 8; ++j) y[j] = glu_value(a, g[j], u[j]);
  detail::store16(out + r * ld_out + c, detail::pack8(y));
}

// A half-warp per (row, 128-wide group); lane l of it holds columns 8l..8l+7. A block is one group of 16
// consecutive rows, so its 16 scales land side by side (scales are [groups][rows_pad]) instead of as 16
// scattered 4-byte writes. Rows rows..rows_pad-1 are written as zeros (the FP8 GEMM reads them). The values
// are rounded to bf16 (what the unfused model quantizes) two per conversion (F2FP on the ALU) and widened
// back with bit operations: a one-value F2F runs on the special-function unit, which the activation's
// transcendentals already fill.
template <int kKind>
__global__ void glu_fp8_kernel(Act a, const bf16* __restrict__ gate, const bf16* __restrict__ up, int64_t ld_in,
                               uint8_t* __restrict__ out_q, float* __restrict__ scales, int64_t rows, int64_t rows_pad,
                               int64_t row0, int width) {
  const int gi = blockIdx.x;
  const int lane = threadIdx.x & 15;
  const int64_t r = row0 + static_cast<int64_t>(blockIdx.y) * 16 + (threadIdx.x >> 4);
  const bool active = r < rows_pad;
  const int c = gi * 128 + lane * 8;
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (r < rows) {
    float g[8], u[8];
    detail::unpack8(detail::ldcs16(gate + r * ld_in + c), g);
    detail::unpack8(detail::ldcs16(up + r * ld_in + c), u);
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
      const uint32_t p =
          detail::pack_bf16x2(glu_value_k<kKind>(a, g[j], u[j]), glu_value_k<kKind>(a, g[j + 1], u[j + 1]));
      v[j] = __uint_as_float(p << 16);
      v[j + 1] = __uint_as_float(p & 0xFFFF0000u);
    }
  }
  float scale;
  const uint2 codes = detail::quantize_group8(v, &scale);
  if (!active) return;
  *reinterpret_cast<uint2*>(out_q + r * width + c) = codes;
  if (lane == 0) scales[static_cast<int64_t>(gi) * rows_pad + r] = scale;
}

Act make_act(const Glu& g) {
  if (g.kind == Glu::Kind::kSitu) {
    // The kernels multiply by 1 / beta: below about 2.9e-39 that is +inf, and a zero input would give
    // 0 · inf = NaN where the formula (and the CPU, which divides) gives 0.
    KIMIRT_CUDA_REQUIRE(std::isfinite(g.beta) && g.beta > 0.0f && std::isfinite(1.0f / g.beta),
                        "glu: SiTU beta (activation_situ_beta) ", g.beta,
                        " must be finite and positive, with a finite reciprocal (at least 2.9e-39)");
    // <= 0 means absent; NaN or +inf would pass through silently or make every output NaN. The kernels scale
    // by the product of the two betas, which must be a float too (the CPU multiplies them one at a time).
    KIMIRT_CUDA_REQUIRE(g.linear_beta <= 0.0f || (std::isfinite(g.linear_beta) && std::isfinite(1.0f / g.linear_beta) &&
                                                  std::isfinite(g.beta * g.linear_beta)),
                        "glu: SiTU linear beta (activation_situ_linear_beta) ", g.linear_beta,
                        " must be finite, with a finite reciprocal (at least 2.9e-39) and a finite product with beta ",
                        g.beta, ", or <= 0: absent");
  }
  Act a{g.kind == Glu::Kind::kSitu,
        g.beta,
        1.0f / g.beta,
        g.linear_beta,
        g.linear_beta > 0.0f ? 1.0f / g.linear_beta : 0.0f,
        g.linear_beta > 0.0f ? g.beta * g.linear_beta : g.beta};
  return a;
}

void check_inputs(const char* op, const void* gate, const void* up, int64_t ld_in, int64_t rows, int64_t width) {
  KIMIRT_CUDA_REQUIRE(rows >= 0 && width > 0 && width % 8 == 0, op, ": width ", width,
                      " must be a positive multiple of 8 (rows ", rows, ")");
  KIMIRT_CUDA_REQUIRE(ld_in >= width && ld_in % 8 == 0, op, ": input row stride ", ld_in,
                      " must be >= width and a multiple of 8");
  KIMIRT_CUDA_REQUIRE(gate && up && detail::aligned16(gate) && detail::aligned16(up), op,
                      ": gate and up must be non-null and 16-byte aligned");
}

}  // namespace

void glu(cudaStream_t stream, const Glu& act, const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t ld_in,
         __nv_bfloat16* out, int64_t ld_out, int64_t rows, int64_t width) {
  check_inputs("glu", gate, up, ld_in, rows, width);
  KIMIRT_CUDA_REQUIRE(out && detail::aligned16(out) && ld_out >= width && ld_out % 8 == 0,
                      "glu: out must be 16-byte aligned with a row stride >= width and a multiple of 8 (got ", ld_out,
                      ")");
  KIMIRT_CUDA_REQUIRE(width < (1 << 30), "glu: width ", width, " too large");
  const Act a = make_act(act);
  const int threads = 256;
  const unsigned bx = static_cast<unsigned>((width / 8 + threads - 1) / threads);
  for (int64_t row0 = 0; row0 < rows; row0 += 65535) {
    const unsigned by = static_cast<unsigned>(std::min<int64_t>(65535, rows - row0));
    glu_kernel<<<dim3(bx, by), threads, 0, stream>>>(a, gate, up, ld_in, out, ld_out, row0, static_cast<int>(width));
    KIMIRT_CUDA_CHECK_LAUNCH();
  }
}

void glu_fp8(cudaStream_t stream, const Glu& act, const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t ld_in,
             uint8_t* out_q, float* out_scales, int64_t rows, int64_t width) {
  check_inputs("glu_fp8", gate, up, ld_in, rows, width);
  KIMIRT_CUDA_REQUIRE(width % 128 == 0, "glu_fp8: width ", width, " must be a multiple of 128");
  KIMIRT_CUDA_REQUIRE(out_q && out_scales && (reinterpret_cast<uintptr_t>(out_q) & 7u) == 0,
                      "glu_fp8: out_q (8-byte aligned) and out_scales must be non-null");
  KIMIRT_CUDA_REQUIRE(width < (1 << 30), "glu_fp8: width ", width, " too large");
  const Act a = make_act(act);
  if (rows == 0) return;
  const int64_t rows_pad = (rows + 3) / 4 * 4;
  const unsigned bx = static_cast<unsigned>(width / 128);
  for (int64_t row0 = 0; row0 < rows_pad; row0 += int64_t{65535} * 16) {
    const unsigned by = static_cast<unsigned>(std::min<int64_t>(65535, (rows_pad - row0 + 15) / 16));
    const dim3 grid(bx, by);
    const int w = static_cast<int>(width);
    const int kind = glu_kind(a);
    if (kind == 0) {
      glu_fp8_kernel<0><<<grid, 256, 0, stream>>>(a, gate, up, ld_in, out_q, out_scales, rows, rows_pad, row0, w);
    } else if (kind == 2) {
      glu_fp8_kernel<2><<<grid, 256, 0, stream>>>(a, gate, up, ld_in, out_q, out_scales, rows, rows_pad, row0, w);
    } else {
      glu_fp8_kernel<1><<<grid, 256, 0, stream>>>(a, gate, up, ld_in, out_q, out_scales, rows, rows_pad, row0, w);
    }
    KIMIRT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kimirt::cuda
