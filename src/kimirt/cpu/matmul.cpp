#include "kimirt/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include "kimirt/base/error.h"
#include "kimirt/base/thread_pool.h"

#ifdef KIMIRT_HAVE_BLAS
#include <cblas.h>
#endif

namespace kimirt::cpu {
namespace {

// Eight independent partial sums let the compiler vectorize the dot product without reassociating
// floating-point additions (which it may not do without -ffast-math).
float dot(const float* a, const float* b, int64_t k) {
  constexpr int kLanes = 8;
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  }
  float tail = 0.0f;
  for (; i < k; ++i) tail += a[i] * b[i];
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  return sum + tail;
}

void check_dims(int64_t m, int64_t n, int64_t k) {
  KIMIRT_CHECK(m >= 0 && n >= 0 && k >= 0, "matmul: negative dimension (m={}, n={}, k={})", m, n, k);
  // BLAS takes 32-bit dimensions.
  constexpr int64_t kMaxDim = std::numeric_limits<int>::max();
  KIMIRT_CHECK(m <= kMaxDim && n <= kMaxDim && k <= kMaxDim, "matmul: dimension too large (m={}, n={}, k={})", m, n, k);
}

}  // namespace

void matmul_loop(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
  check_dims(m, n, k);
  if (m == 0 || n == 0) return;
  // A block of weight rows is reused by every x row while it sits in cache.
  constexpr int64_t kRowBlock = 64;
  auto& pool = ThreadPool::global();
  const auto threads = static_cast<int64_t>(pool.num_threads());
  if (m >= threads) {
    pool.parallel_for(m, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t j0 = 0; j0 < n; j0 += kRowBlock) {
        const int64_t j1 = std::min(n, j0 + kRowBlock);
        for (int64_t i = r0; i < r1; ++i) {
          for (int64_t j = j0; j < j1; ++j) y[i * n + j] = dot(x + i * k, w + j * k, k);
        }
      }
    });
  } else {
    // Decode-sized products (a handful of rows): split the output columns instead.
    pool.parallel_for(n, 16, [&](int64_t j0, int64_t j1) {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = j0; j < j1; ++j) y[i * n + j] = dot(x + i * k, w + j * k, k);
      }
    });
  }
}

#ifdef KIMIRT_HAVE_BLAS
namespace {
// OpenBLAS keeps its own thread count; follow the global pool's size, asking only when it changed.
void sync_blas_threads() {
  static std::atomic<int> applied{0};
  const int want = static_cast<int>(ThreadPool::global().num_threads());
  if (applied.load(std::memory_order_relaxed) != want) {
    openblas_set_num_threads(want);
    applied.store(want, std::memory_order_relaxed);
  }
}
}  // namespace

void matmul(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
  check_dims(m, n, k);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(y, y + m * n, 0.0f);
    return;
  }
  sync_blas_threads();
  // OpenBLAS's sgemm packs the whole weight on every call, which dominates at decode sizes: there a
  // matrix-vector product per row streams the weight once and runs about 3x faster.
  constexpr int64_t kMaxGemvRows = 4;
  if (m <= kMaxGemvRows) {
    for (int64_t i = 0; i < m; ++i) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, w, static_cast<int>(k),
                  x + i * k, 1, 0.0f, y + i * n, 1);
    }
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0f, x, static_cast<int>(k), w, static_cast<int>(k), 0.0f, y, static_cast<int>(n));
}

bool matmul_uses_blas() { return true; }
#else
void matmul(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
  matmul_loop(x, w, y, m, n, k);
}

bool matmul_uses_blas() { return false; }
#endif

}  // namespace kimirt::cpu
