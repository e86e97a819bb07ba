// Fills device buffers with reproducible pseudo-random values (tests and benchmarks never run on zeros),
// and poisons outputs with NaN so that an element a kernel forgot to write shows up in the comparison.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kimirt::cuda {

// Uniform in [lo, hi] (hi only where rounding to the element type reaches it), element i a function of (seed, i)
// only.
void fill_uniform(__nv_bfloat16* data, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t stream);
void fill_uniform(float* data, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t stream);
// E4M3 codes of uniform values in [lo, hi] (saturating; rounded to E4M3, hi comes up more often than in bf16).
void fill_uniform_e4m3(uint8_t* data, int64_t n, float lo, float hi, uint64_t seed, cudaStream_t stream);

// All bytes 0xFF: NaN in bf16, f32 and E4M3 alike.
void poison(void* data, uint64_t bytes, cudaStream_t stream);

}  // namespace kimirt::cuda
