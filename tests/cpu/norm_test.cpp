#include "kimirt/cpu/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kimirt/base/error.h"
#include "test_util.h"

namespace kimirt::cpu {
namespace {

using testing::random_normal;
using testing::random_uniform;
using testing::ref_rms_norm;
using testing::ref_sigmoid;
using testing::rel_error;
using testing::to_double;

TEST(CpuNorm, RmsNormHandCase) {
  // mean([3, 4]²) = 12.5; eps 0.5 → r = 1/√13.
  const std::vector<float> x = {3, 4};
  const std::vector<float> w = {1, 2};
  std::vector<float> y(2);
  rms_norm(x.data(), w.data(), y.data(), 1, 2, 0.5f);
  EXPECT_NEAR(y[0], 3.0 / std::sqrt(13.0), 1e-6);
  EXPECT_NEAR(y[1], 8.0 / std::sqrt(13.0), 1e-6);
}

TEST(CpuNorm, RmsNormRowsInPlaceMatchDouble) {
  const int64_t rows = 5, dim = 48;
  auto x = random_normal(rows * dim, 3, 2.0f);
  const auto w = random_uniform(dim, 4, 0.8f, 1.2f);
  const auto ref = ref_rms_norm(to_double(x), w, rows, dim, 1e-5);
  rms_norm(x.data(), w.data(), x.data(), rows, dim, 1e-5f);
  EXPECT_LE(rel_error(x, ref), 1e-6);
}

TEST(CpuNorm, RmsNormalizeHasNoWeight) {
  const std::vector<float> x = {1, -1, 1, -1};
  std::vector<float> y(4);
  rms_normalize(x.data(), y.data(), 1, 4, 0.0f);
  EXPECT_EQ(y, x);  // mean(x²) = 1
}

TEST(CpuNorm, GatedNormIsPerHeadWithSharedWeightTimesSigmoidGate) {
  const int64_t rows = 3, heads = 4, hd = 8;
  const auto x = random_normal(rows * heads * hd, 5);
  const auto gate = random_normal(x.size(), 6, 3.0f);
  const auto w = random_uniform(hd, 7, 0.5f, 1.5f);
  std::vector<float> y(x.size());
  rms_norm_gated(x.data(), gate.data(), w.data(), y.data(), rows, heads, hd, 1e-5f);
  // Each head is its own RMSNorm row.
  auto ref = ref_rms_norm(to_double(x), w, rows * heads, hd, 1e-5);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] *= ref_sigmoid(gate[i]);
  EXPECT_LE(rel_error(y, ref), 1e-6);
}

TEST(CpuNorm, L2NormalizeHandCase) {
  const std::vector<float> x = {3, 4, 0, 0};
  std::vector<float> y(4);
  l2_normalize(x.data(), y.data(), 2, 2, 0.0f, 2.0f);
  EXPECT_FLOAT_EQ(y[0], 1.2f);
  EXPECT_FLOAT_EQ(y[1], 1.6f);
  // eps sits inside the root: a zero vector stays zero instead of dividing by zero.
  l2_normalize(x.data(), y.data(), 2, 2, 1e-6f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_NEAR(y[0], 3.0 / std::sqrt(25.0 + 1e-6), 1e-7);
}

// An eps that is negative or not a number makes rows with mean(x^2) below it NaN: refused, naming the op.
TEST(CpuNorm, NegativeOrNonFiniteEpsIsRefused) {
  const std::vector<float> x(8, 0.5f), w(8, 1.0f);
  std::vector<float> out(8);
  for (const float eps : {-1.0f, std::nanf(""), INFINITY}) {
    EXPECT_THROW(rms_norm(x.data(), w.data(), out.data(), 1, 8, eps), Error) << eps;
    EXPECT_THROW(rms_normalize(x.data(), out.data(), 1, 8, eps), Error) << eps;
    EXPECT_THROW(rms_norm_gated(x.data(), x.data(), w.data(), out.data(), 1, 2, 4, eps), Error) << eps;
    EXPECT_THROW(l2_normalize(x.data(), out.data(), 1, 8, eps, 1.0f), Error) << eps;
  }
  rms_norm(x.data(), w.data(), out.data(), 1, 8, 0.0f);  // 0 is taken (the configs refuse it; direct callers may)
  EXPECT_FLOAT_EQ(out[0], 1.0f);
}

}  // namespace
}  // namespace kimirt::cpu
