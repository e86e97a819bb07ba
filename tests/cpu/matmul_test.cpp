#include "kimirt/cpu/matmul.h"

#include <gtest/gtest.h>

#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/base/thread_pool.h"
#include "test_util.h"

namespace kimirt::cpu {
namespace {

using testing::random_normal;
using testing::ref_matmul;
using testing::rel_error;

TEST(CpuMatmul, HandCheckedProductInCheckpointLayout) {
  // x [2, 3], W [out = 2, in = 3]: y = x · Wᵀ.
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const std::vector<float> w = {1, 0, -1, 2, 1, 0};
  const std::vector<float> expected = {1 - 3, 2 + 2, 4 - 6, 8 + 5};
  std::vector<float> y(4), y_loop(4);
  matmul(x.data(), w.data(), y.data(), 2, 2, 3);
  matmul_loop(x.data(), w.data(), y_loop.data(), 2, 2, 3);
  EXPECT_EQ(y, expected);
  EXPECT_EQ(y_loop, expected);
}

// Shapes that exercise the row split, the column split (decode) and dot-product tails.
TEST(CpuMatmul, BlasAndLoopAgreeWithDoubleReference) {
  struct Shape {
    int64_t m, n, k;
  };
  for (size_t threads : {1, 3}) {
    ThreadPool::set_global_threads(threads);
    for (const Shape s : {Shape{1, 37, 13}, Shape{2, 130, 64}, Shape{17, 70, 257}, Shape{64, 1, 9}}) {
      const auto x = random_normal(s.m * s.k, 1);
      const auto w = random_normal(s.n * s.k, 2);
      const auto ref = ref_matmul(x, w, s.m, s.n, s.k);
      std::vector<float> y(static_cast<size_t>(s.m * s.n)), y_loop(y.size());
      matmul(x.data(), w.data(), y.data(), s.m, s.n, s.k);
      matmul_loop(x.data(), w.data(), y_loop.data(), s.m, s.n, s.k);
      EXPECT_LE(rel_error(y, ref), 1e-6) << s.m << "x" << s.n << "x" << s.k << " threads " << threads;
      EXPECT_LE(rel_error(y_loop, ref), 1e-6) << s.m << "x" << s.n << "x" << s.k << " threads " << threads;
      EXPECT_LE(rel_error(y_loop, y), 1e-6);
    }
  }
  ThreadPool::set_global_threads(hardware_threads());
}

TEST(CpuMatmul, EmptyInnerDimensionGivesZeros) {
  std::vector<float> y(6, 7.0f);
  matmul(nullptr, nullptr, y.data(), 2, 3, 0);
  EXPECT_EQ(y, std::vector<float>(6, 0.0f));
  std::vector<float> y_loop(6, 7.0f);
  matmul_loop(nullptr, nullptr, y_loop.data(), 2, 3, 0);
  EXPECT_EQ(y_loop, std::vector<float>(6, 0.0f));
}

TEST(CpuMatmul, NegativeDimensionIsAnError) {
  float y = 0.0f;
  EXPECT_THROW(matmul(&y, &y, &y, -1, 1, 1), Error);
  EXPECT_THROW(matmul_loop(&y, &y, &y, 1, 1, -2), Error);
}

TEST(CpuMatmul, ReportsWhichPathItUses) {
#ifdef KIMIRT_HAVE_BLAS
  EXPECT_TRUE(matmul_uses_blas());
#else
  EXPECT_FALSE(matmul_uses_blas());
#endif
}

}  // namespace
}  // namespace kimirt::cpu
