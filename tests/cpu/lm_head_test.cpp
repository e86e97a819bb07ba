#include "kimirt/cpu/lm_head.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kimirt/base/error.h"

namespace kimirt::cpu {
namespace {

TEST(CpuLmHead, LogitsAreProductWithVocabRows) {
  const std::vector<float> x = {1, 2};
  const std::vector<float> w = {1, 0, 0, 1, 1, 1};  // vocab 3
  std::vector<float> logits(3);
  lm_head(x.data(), w.data(), 1, 2, 3, logits.data());
  EXPECT_EQ(logits, (std::vector<float>{1, 2, 3}));
}

TEST(CpuLmHead, NullOperandsOrBadShapesAreErrors) {
  const std::vector<float> x = {1, 2}, w = {1, 0, 0, 1, 1, 1};
  std::vector<float> logits(3);
  EXPECT_THROW(lm_head(x.data(), nullptr, 1, 2, 3, logits.data()), Error);
  EXPECT_THROW(lm_head(nullptr, w.data(), 1, 2, 3, logits.data()), Error);
  EXPECT_THROW(lm_head(x.data(), w.data(), 1, 2, 0, logits.data()), Error);
  EXPECT_THROW(lm_head(x.data(), w.data(), -1, 2, 3, logits.data()), Error);
  EXPECT_THROW(lm_head(x.data(), w.data(), 1, 0, 3, logits.data()), Error);
  EXPECT_THROW(lm_head(x.data(), w.data(), 1, 2, 3, nullptr), Error);
  lm_head(nullptr, w.data(), 0, 2, 3, nullptr);  // no tokens: nothing to read or write
}

TEST(CpuLmHead, ArgmaxPicksLowestIndexOnTiesAndSkipsNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> tie = {1, 5, 3, 5};
  EXPECT_EQ(argmax(tie.data(), 4), 1);
  const std::vector<float> with_nan = {nan, -2, nan, -1};
  EXPECT_EQ(argmax(with_nan.data(), 4), 3);
  const std::vector<float> rows = {0, 1, 2, 9, 8, 7};
  int32_t ids[2];
  argmax_rows(rows.data(), 2, 3, ids);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 0);
  EXPECT_THROW(argmax(rows.data(), 0), Error);
}

}  // namespace
}  // namespace kimirt::cpu
