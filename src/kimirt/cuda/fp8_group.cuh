// Quantization of one 128-wide group held by 16 or 8 lanes to E4M3 with an fp32 scale:
// shared by the activation quantizer and the FP8 outputs of fused kernels, so both round identically.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "kimirt/cuda/device_utils.cuh"

namespace kimirt::cuda::detail {

__device__ __forceinline__ uint8_t e4m3(float f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}

// a / b correctly rounded, from r = RN(1 / b): one FMA-refined product (Markstein) instead of the division
// sequence per value. Exact for the quotients here (|a / b| <= 448) while r is below 2^90, so the codes equal
// those of v / scale on the host bit for bit. For smaller scales the residual fma(-q, b, a) of a value near
// the bottom of the float range underflows and loses bits: with amax = 23 · 2^-122 and v = 69 · 2^-133 the
// quotient comes out one step above the e4m3 rounding tie that v / scale sits on (a review's exhaustive
// emulation; Gemm.Fp8ActQuantizerTinyGroups holds two such groups).
__device__ __forceinline__ float div_by(float a, float b, float r) {
  const float q = a * r;
  return fmaf(fmaf(-q, b, a), r, q);
}

// A 128-wide group held by 128 / N consecutive lanes (aligned to 128 / N), N values each (8: a half-warp,
// 16: a quarter-warp): *scale gets amax / 448 over its 128 values (1 for an all-zero group), codes[i] the
// lane's values 4i..4i+3 as e4m3(v / scale), little-endian (value 4i in the low byte). The shuffles use the
// whole warp's mask: every lane of the warp must call it. More values per lane spread the group's scalar work
// (the shuffles, the scale's division, its reciprocal) over more values.
template <int N>
__device__ __forceinline__ void quantize_group(const float (&v)[N], float* scale, uint32_t (&codes)[N / 4]) {
  static_assert(N == 8 || N == 16, "a 128-group over 16 or 8 lanes");
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int o = 64 / N; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
  *scale = s;
  const float r = 1.0f / s;
  float q[N];
  // Groups whose scale is below 2^-90 (bf16 holds such values) divide: div_by is inexact there (above), and
  // below about 1.3e-36 r = inf, as r = 0 for an infinite amax, would turn every code into NaN. One test per
  // group, outside the values' loop: tested per value (inside div_by) it cost a branch and two convergence
  // barriers per value, a third of rms_norm_fp8's instructions (PERF.md, 2026-11-30, machine CK).
  if (r > 0.0f && r < 0x1p90f) {
#pragma unroll
    for (int i = 0; i < N; ++i) q[i] = div_by(v[i], s, r);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) q[i] = v[i] / s;
  }
  // Two values per conversion instruction (the same rounding as e4m3() one at a time), no shifts to pack.
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(float2{q[4 * i], q[4 * i + 1]}, __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(float2{q[4 * i + 2], q[4 * i + 3]}, __NV_SATFINITE, __NV_E4M3);
    codes[i] = lo | (hi << 16);
  }
}

// The half-warp form (8 values per lane), codes as one 8-byte word.
__device__ __forceinline__ uint2 quantize_group8(const float (&v)[8], float* scale) {
  uint32_t c[2];
  quantize_group(v, scale, c);
  return uint2{c[0], c[1]};
}

}  // namespace kimirt::cuda::detail
