// Dense fp32 products in the checkpoint layout: weights are stored [out, in] (PyTorch nn.Linear), so every
// projection of the model is y = x · Wᵀ. One entry point picks OpenBLAS when the build has it; the plain
// loop is always compiled so that tests can hold the two against each other.
#pragma once

#include <cstdint>

namespace kimirt::cpu {

// y[m, n] = x[m, k] · w[n, k]ᵀ, all row-major and contiguous; y must not overlap x or w. Uses
// cblas_sgemm when KIMIRT_HAVE_BLAS is defined (threads = the global ThreadPool's size), else matmul_loop.
// Must not be called from inside a ThreadPool::global() parallel_for (it parallelizes itself).
void matmul(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k);

// Same product by a blocked loop, parallel over output rows (or columns when m is small) on the global
// ThreadPool. fp32 accumulation in 8 independent lanes per dot product.
void matmul_loop(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k);

// True when matmul() goes through OpenBLAS.
bool matmul_uses_blas();

}  // namespace kimirt::cpu
