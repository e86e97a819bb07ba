// Quantization of one 128-wide group held by a half-warp (8 values per lane) to E4M3 with an fp32 scale:
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
// sequence per value. Exact for the quotients here (|a / b| <= 448) while r is finite and not 0, so the codes
// equal those of v / scale on the host bit for bit. A group whose largest magnitude is below about 1.3e-36
// (bf16 holds such values) has r = inf, an infinite one r = 0: both would turn every code into NaN, so they
// divide (the branch is the same for the whole group).
__device__ __forceinline__ float div_by(float a, float b, float r) {
  if (!(r > 0.0f && r < INFINITY)) return a / b;
  const float q = a * r;
  return fmaf(fmaf(-q, b, a), r, q);
}

// A 128-wide group held by a half-warp (8 values per lane, 16 lanes): *scale gets amax / 448 over its 128
// values (1 for an all-zero group), and the lane's 8 codes e4m3(v / scale) come back packed little-endian
// (value 0 in the low byte). The shuffles use the whole warp's mask: both halves must call it.
__device__ __forceinline__ uint2 quantize_group8(const float (&v)[8], float* scale) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
  *scale = s;
  const float r = 1.0f / s;
  // Two values per conversion instruction (the same rounding as e4m3() one at a time), no shifts to pack.
  uint32_t pairs[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f{div_by(v[2 * i], s, r), div_by(v[2 * i + 1], s, r)};
    pairs[i] = static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3));
  }
  return uint2{pairs[0] | (pairs[1] << 16), pairs[2] | (pairs[3] << 16)};
}

}  // namespace kimirt::cuda::detail
