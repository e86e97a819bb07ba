// Quantization of one 128-wide group held by a warp (4 values per lane) to E4M3 with an fp32 scale:
// shared by the activation quantizer and the FP8 outputs of fused kernels, so both round identically.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "kimirt/cuda/device_utils.cuh"

namespace kimirt::cuda::detail {

__device__ __forceinline__ uint8_t e4m3(float f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}

// Returns the 4 codes of this lane packed little-endian (value 0 in the low byte); *scale gets
// amax / 448 over the warp's 128 values (1 for an all-zero group).
__device__ __forceinline__ uint32_t quantize_group4(const float (&v)[4], float* scale) {
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  amax = warp_max(amax);
  const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
  *scale = s;
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) packed |= static_cast<uint32_t>(e4m3(v[i] / s)) << (8 * i);
  return packed;
}

}  // namespace kimirt::cuda::detail
