// Philox4x32-10, the counter-based generator of Salmon et al. (SC'11): a pure function of a 128-bit
// counter and a 64-bit key, so every (seed, step, index) gets its own random numbers without state and
// the same request sampled twice gives the same tokens.
#pragma once

#include <cstdint>

namespace kimirt::cuda::detail {

struct Philox4 {
  uint32_t x, y, z, w;
};

__host__ __device__ __forceinline__ uint32_t mulhi32(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

__host__ __device__ __forceinline__ Philox4 philox4x32_10(Philox4 ctr, uint64_t key64) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t k0 = static_cast<uint32_t>(key64), k1 = static_cast<uint32_t>(key64 >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t lo0 = kM0 * ctr.x, hi0 = mulhi32(kM0, ctr.x);
    const uint32_t lo1 = kM1 * ctr.z, hi1 = mulhi32(kM1, ctr.z);
    ctr = Philox4{hi1 ^ ctr.y ^ k0, lo1, hi0 ^ ctr.w ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// Uniform in the open interval (0, 1), so that log(u) and log(-log(u)) are finite: 23 random bits, offset
// by half a step. Not 24: (2^24 - 1) + 0.5 needs 25 significant bits and rounds to 2^24, i.e. u == 1 and
// a Gumbel noise of +inf once in 2^24 draws; with 23 bits every value k + 0.5 is exact and the largest
// u is 1 - 2^-24.
__host__ __device__ __forceinline__ float uniform_open01(uint32_t bits) {
  return (static_cast<float>(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
}

}  // namespace kimirt::cuda::detail
