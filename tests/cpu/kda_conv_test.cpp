#include "kimirt/cpu/kda_conv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "test_util.h"

namespace kimirt::cpu {
namespace {

using testing::random_normal;
using testing::ref_silu;

TEST(CpuKdaConv, TapsLineUpWithCurrentTokenLast) {
  // One channel, W = 4, taps w = [1, 10, 100, 1000]: tap 3 multiplies the current token.
  const std::vector<float> w = {1, 10, 100, 1000};
  const std::vector<float> x = {1, 2, 3, 4, 5};
  std::vector<float> state(3, 0.0f), y(5);
  short_conv_silu(x.data(), w.data(), state.data(), 5, 1, 4, y.data());
  const double pre[5] = {1000 * 1, 1000 * 2 + 100 * 1, 1000 * 3 + 100 * 2 + 10 * 1, 1000 * 4 + 100 * 3 + 10 * 2 + 1,
                         1000 * 5 + 100 * 4 + 10 * 3 + 2};
  for (int t = 0; t < 5; ++t) EXPECT_NEAR(y[t], ref_silu(pre[t]), 1e-3) << t;
  // The carried window is the last three PRE-conv inputs, oldest first.
  EXPECT_EQ(state, (std::vector<float>{3, 4, 5}));
}

TEST(CpuKdaConv, CarriedStateFeedsTheNextCall) {
  const std::vector<float> w = {0.5f, -1.0f, 2.0f};  // W = 3
  std::vector<float> state = {7.0f, -3.0f};          // inputs before this call: 7, then −3
  const std::vector<float> x = {1.0f};
  float y = 0.0f;
  short_conv_silu(x.data(), w.data(), state.data(), 1, 1, 3, &y);
  EXPECT_NEAR(y, ref_silu(0.5 * 7 - 1.0 * -3 + 2.0 * 1), 1e-6);
  EXPECT_EQ(state, (std::vector<float>{-3.0f, 1.0f}));
}

TEST(CpuKdaConv, SplitSequenceEqualsOneCall) {
  const int64_t T = 9, C = 5, W = 4;
  const auto x = random_normal(T * C, 31);
  const auto w = random_normal(C * W, 32, 0.3f);
  std::vector<float> state_full((W - 1) * C, 0.0f), y_full(T * C);
  short_conv_silu(x.data(), w.data(), state_full.data(), T, C, W, y_full.data());
  for (int64_t split : {1, 2, 5, 8}) {
    std::vector<float> state((W - 1) * C, 0.0f), y(T * C);
    short_conv_silu(x.data(), w.data(), state.data(), split, C, W, y.data());
    // Then one token at a time (decode) for the rest.
    for (int64_t t = split; t < T; ++t) {
      short_conv_silu(x.data() + t * C, w.data(), state.data(), 1, C, W, y.data() + t * C);
    }
    EXPECT_EQ(y, y_full) << "split " << split;
    EXPECT_EQ(state, state_full) << "split " << split;
  }
}

TEST(CpuKdaConv, ShortSequenceShiftsOlderStateThrough) {
  // Fewer tokens than W − 1: the state keeps its newest old entries, then the new inputs.
  const std::vector<float> w = {0, 0, 0, 1};
  std::vector<float> state = {1, 2, 3};
  const std::vector<float> x = {4};
  float y;
  short_conv_silu(x.data(), w.data(), state.data(), 1, 1, 4, &y);
  EXPECT_EQ(state, (std::vector<float>{2, 3, 4}));
  // The last tap is the current token: y = silu(1 · 4).
  EXPECT_NEAR(y, 4.0 / (1.0 + std::exp(-4.0)), 1e-6);
}

}  // namespace
}  // namespace kimirt::cpu
