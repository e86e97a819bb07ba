// Device random fill and NaN poisoning.
#include <algorithm>

#include "kimirt/cuda/check.h"
#include "kimirt/cuda/device_utils.cuh"
#include "kimirt/cuda/philox.cuh"
#include "kimirt/cuda/random_fill.h"

namespace kimirt::cuda {
namespace {

template <typename T>
__device__ __forceinline__ T from_float(float f);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}
template <>
__device__ __forceinline__ float from_float<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ uint8_t from_float<uint8_t>(float f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}

template <typename T>
__global__ void fill_uniform_kernel(T* data, int64_t n, float lo, float span, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * 4;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4; base < n; base += stride) {
    const uint64_t group = static_cast<uint64_t>(base) / 4;
    const detail::Philox4 r = detail::philox4x32_10(
        detail::Philox4{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32), 0x5eedu, 0u}, seed);
    const uint32_t bits[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (base + i < n) data[base + i] = from_float<T>(lo + span * (detail::uniform_open01(bits[i])));
    }
  }
}

template <typename T>
void launch_fill(T* data, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
  KIMIRT_CUDA_REQUIRE(n >= 0, "fill_uniform: negative element count ", n);
  KIMIRT_CUDA_REQUIRE(hi >= lo, "fill_uniform: hi ", hi, " < lo ", lo);
  if (n == 0) return;
  const int64_t groups = (n + 3) / 4;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((groups + threads - 1) / threads, 65536);
  fill_uniform_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(data, n, lo, hi - lo, seed);
  KIMIRT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void fill_uniform(__nv_bfloat16* data, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
  launch_fill(data, n, lo, hi, seed, stream);
}
void fill_uniform(float* data, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
  launch_fill(data, n, lo, hi, seed, stream);
}
void fill_uniform_e4m3(uint8_t* data, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
  launch_fill(data, n, lo, hi, seed, stream);
}

void poison(void* data, uint64_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  KIMIRT_CUDA_CHECK(cudaMemsetAsync(data, 0xFF, bytes, stream));
}

}  // namespace kimirt::cuda
