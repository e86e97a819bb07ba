#include "kimirt/cpu/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kimirt/base/error.h"
#include "test_util.h"

namespace kimirt::cpu {
namespace {

RouterConfig config(int64_t experts, int64_t k, int64_t groups = 1, int64_t topk_group = 1) {
  RouterConfig c;
  c.num_experts = experts;
  c.top_k = k;
  c.num_expert_group = groups;
  c.topk_group = topk_group;
  return c;
}

TEST(CpuRouter, BiasSelectsButWeightsAreRawSigmoidRenormalizedAndScaled) {
  auto cfg = config(4, 2);
  cfg.routed_scaling_factor = 2.5f;
  const std::vector<float> scores = {0.9f, 0.1f, 0.5f, 0.3f};
  const std::vector<float> bias = {0.0f, 1.0f, 0.0f, 0.0f};  // biased: 0.9, 1.1, 0.5, 0.3
  int32_t ids[2];
  float w[2];
  select_experts(cfg, scores.data(), bias.data(), ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 0);
  // Raw scores 0.1 and 0.9, renormalized to 0.1 and 0.9 (sum 1), times 2.5.
  EXPECT_NEAR(w[0], 0.1 / 1.0 * 2.5, 1e-6);
  EXPECT_NEAR(w[1], 0.9 / 1.0 * 2.5, 1e-6);
}

TEST(CpuRouter, RenormalizationDividesBySumPlusTinyEpsilon) {
  auto cfg = config(3, 2);
  const std::vector<float> scores = {0.2f, 0.6f, 0.1f};
  int32_t ids[2];
  float w[2];
  select_experts(cfg, scores.data(), nullptr, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 0);
  EXPECT_NEAR(w[0], 0.75, 1e-6);
  EXPECT_NEAR(w[1], 0.25, 1e-6);
  // Where the epsilon shows: chosen scores that are all 0 (sigmoid underflowed) give weights 0, not 0/0 = NaN.
  const std::vector<float> zeros = {0.0f, 0.0f, 0.0f};
  select_experts(cfg, zeros.data(), nullptr, ids, w);
  EXPECT_EQ(w[0], 0.0f);
  EXPECT_EQ(w[1], 0.0f);
  cfg.renormalize = false;
  select_experts(cfg, scores.data(), nullptr, ids, w);
  EXPECT_NEAR(w[0], 0.6, 1e-7);
  EXPECT_NEAR(w[1], 0.2, 1e-7);
}

TEST(CpuRouter, SingleExpertIsNotRenormalized) {
  // As the K3 reference: renormalization needs top_k > 1.
  auto cfg = config(3, 1);
  const std::vector<float> scores = {0.2f, 0.6f, 0.1f};
  int32_t id;
  float w;
  select_experts(cfg, scores.data(), nullptr, &id, &w);
  EXPECT_EQ(id, 1);
  EXPECT_NEAR(w, 0.6, 1e-7);
}

TEST(CpuRouter, TiesGoToTheLowestExpertId) {
  auto cfg = config(6, 3);
  // Biased scores: 0.5 at experts 1, 2, 4 and 5 (after bias), 0.2 elsewhere.
  const std::vector<float> scores = {0.2f, 0.5f, 0.25f, 0.2f, 0.5f, 0.5f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.25f, 0.0f, 0.0f, 0.0f};
  int32_t ids[3];
  float w[3];
  select_experts(cfg, scores.data(), bias.data(), ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 4);
}

TEST(CpuRouter, NanScoresRankBelowEveryNumber) {
  // As the GPU router's order key: a NaN expert is never chosen while a number (even -inf) remains, and
  // NaNs among themselves go by id. With `>` alone the sort's order was inconsistent (undefined).
  const float nan = std::nanf("");
  const float inf = std::numeric_limits<float>::infinity();
  for (int rot = 0; rot < 5; ++rot) {
    std::vector<float> scores = {nan, 0.3f, nan, 0.7f, 0.1f};
    std::vector<float> bias = {0.0f, 0.0f, 0.0f, 0.0f, -inf};
    std::rotate(scores.begin(), scores.begin() + rot, scores.end());
    std::rotate(bias.begin(), bias.begin() + rot, bias.end());
    auto id_of = [&](int original) { return (original - rot + 5) % 5; };
    int32_t ids[5];
    float w[5];
    auto cfg = config(5, 5);
    cfg.renormalize = false;
    select_experts(cfg, scores.data(), bias.data(), ids, w);
    const int nan_first = std::min(id_of(0), id_of(2)), nan_second = std::max(id_of(0), id_of(2));
    const std::vector<int32_t> want = {id_of(3), id_of(1), id_of(4), nan_first, nan_second};
    EXPECT_EQ(std::vector<int32_t>(ids, ids + 5), want) << "rotation " << rot;
  }
}

TEST(CpuRouter, SelectExpertsChecksItsConfig) {
  const std::vector<float> scores = {0.2f, 0.6f, 0.1f, 0.4f};
  int32_t ids[8];
  float w[8];
  EXPECT_THROW(select_experts(config(4, 8), scores.data(), nullptr, ids, w), Error);
  EXPECT_THROW(select_experts(config(4, 1, 3), scores.data(), nullptr, ids, w), Error);
}

TEST(CpuRouter, GroupedTopKKeepsGroupsWithBestTwoScoreSum) {
  // 8 experts in 4 groups of 2, keep 2 groups, pick 2. Biased scores:
  //   group 0: 0.90, 0.00 → 0.90     group 1: 0.50, 0.45 → 0.95
  //   group 2: 0.48, 0.47 → 0.95     group 3: 0.10, 0.10 → 0.20
  // Groups 1 and 2 win (a tie in group score would go to the lower group); expert 0, the best single
  // score, is masked out with its group.
  auto cfg = config(8, 2, 4, 2);
  const std::vector<float> scores = {0.90f, 0.00f, 0.50f, 0.45f, 0.48f, 0.47f, 0.10f, 0.10f};
  int32_t ids[2];
  float w[2];
  select_experts(cfg, scores.data(), nullptr, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 4);
  EXPECT_NEAR(w[0], 0.50 / 0.98, 1e-6);
  EXPECT_NEAR(w[1], 0.48 / 0.98, 1e-6);
  // Without grouping the best two overall are chosen.
  select_experts(config(8, 2), scores.data(), nullptr, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 2);
}

TEST(CpuRouter, GroupScoreTieGoesToLowerGroup) {
  // Groups 0 and 1 both sum to 1.0; only one is kept: group 0.
  auto cfg = config(4, 1, 2, 1);
  const std::vector<float> scores = {0.5f, 0.5f, 0.6f, 0.4f};
  int32_t id;
  float w;
  select_experts(cfg, scores.data(), nullptr, &id, &w);
  EXPECT_EQ(id, 0);
}

TEST(CpuRouter, RouteComputesSigmoidOfFp32Logits) {
  // x [1, 2], gate [3, 2]: logits = [1, −2, 0.5].
  auto cfg = config(3, 2);
  const std::vector<float> x = {1.0f, 0.5f};
  const std::vector<float> gate = {1.0f, 0.0f, 0.0f, -4.0f, 0.5f, 0.0f};
  int32_t ids[2];
  float w[2];
  route(cfg, {gate.data(), nullptr}, x.data(), 1, 2, ids, w);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 2);
  const double s0 = testing::ref_sigmoid(1.0), s2 = testing::ref_sigmoid(0.5);
  EXPECT_NEAR(w[0], s0 / (s0 + s2), 1e-6);
  EXPECT_NEAR(w[1], s2 / (s0 + s2), 1e-6);
}

TEST(CpuRouter, InvalidConfigsNameTheField) {
  auto expect_error = [](const RouterConfig& c, const std::string& field) {
    try {
      validate(c);
      FAIL() << "expected an error about " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_error(config(0, 1), "num_experts");
  expect_error(config(4, 5), "num_experts_per_token");
  expect_error(config(6, 2, 4, 1), "num_expert_group");
  expect_error(config(8, 2, 4, 5), "topk_group");
  expect_error(config(8, 4, 4, 1), "topk_group");  // 1 group of 2 cannot supply 4 experts
  expect_error(config(4, 1, 4, 2), "at least 2 experts per group");
  auto bad_scale = config(4, 2);
  bad_scale.routed_scaling_factor = 0.0f;
  expect_error(bad_scale, "routed_scaling_factor");
  EXPECT_NO_THROW(validate(config(896, 16)));
}

}  // namespace
}  // namespace kimirt::cpu
