#include "kimirt/runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "kimirt/base/error.h"

namespace kimirt::runtime {
namespace {

TEST(Sampler, GreedyTiesGoToLowestId) {
  SamplingParams p;
  Sampler s(p, {});
  std::vector<float> logits = {0.1f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(logits), 1);
}

TEST(Sampler, RepetitionPenaltyFollowsHuggingFace) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  const int32_t prompt[] = {0, 1};
  Sampler s(p, prompt);
  // 3.0 / 2 = 1.5 < 2.0 (token 2) and -1 * 2 = -2: token 2 wins.
  std::vector<float> logits = {3.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(logits), 2);
  EXPECT_FLOAT_EQ(logits[0], 1.5f);
  EXPECT_FLOAT_EQ(logits[1], -2.0f);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, {});
  s.record(1);
  s.record(1);
  std::vector<float> logits = {1.0f, 1.9f};
  // 1.9 - 0.5 - 2 * 0.25 = 0.9 < 1.0
  EXPECT_EQ(s.sample(logits), 0);
  EXPECT_FLOAT_EQ(logits[1], 0.9f);
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 1;
  p.seed = 3;
  Sampler s(p, {});
  for (int i = 0; i < 20; ++i) {
    std::vector<float> logits = {0.0f, 0.3f, 0.2f};
    EXPECT_EQ(s.sample(logits), 1);
  }
}

TEST(Sampler, SameSeedSameTokensAndFrequenciesFollowSoftmax) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  const std::vector<float> base = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4
  Sampler a(p, {}), b(p, {});
  std::map<int, int> counts;
  for (int i = 0; i < 4000; ++i) {
    auto la = base, lb = base;
    const int32_t ta = a.sample(la);
    ASSERT_EQ(ta, b.sample(lb));
    counts[ta]++;
  }
  EXPECT_NEAR(counts[1] / 4000.0, 0.75, 0.03);
}

TEST(Sampler, TopPAndMinPCut) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.5f;  // the first candidate alone (p = 0.6) reaches 0.5
  Sampler s(p, {});
  for (int i = 0; i < 50; ++i) {
    std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
    EXPECT_EQ(s.sample(logits), 0);
  }
  SamplingParams q;
  q.temperature = 1.0f;
  q.min_p = 0.4f;  // keeps p >= 0.24: tokens 0 and 1 only
  q.seed = 9;
  Sampler t(q, {});
  for (int i = 0; i < 200; ++i) {
    std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
    EXPECT_NE(t.sample(logits), 2);
  }
}

// The share of token 1 over `draws` draws from logits {0, ln 3} with these params (seed 7).
double share_of_one(SamplingParams p, int draws) {
  p.seed = 7;
  Sampler s(p, {});
  int ones = 0;
  for (int i = 0; i < draws; ++i) {
    std::vector<float> logits = {0.0f, std::log(3.0f)};
    ones += s.sample(logits) == 1;
  }
  return static_cast<double>(ones) / draws;
}

// The temperature divides the logits: {0, ln 3} gives p(1) = 9/10 at T = 0.5 and sqrt(3)/(1 + sqrt(3)) at T = 2
// (every other draw of these tests runs at T = 1, where dividing and multiplying agree). 20000 draws: within 5
// standard deviations (under 0.011).
TEST(Sampler, TemperatureScalesTheLogits) {
  SamplingParams p;
  for (const auto& [t, want] : {std::pair{0.5f, 0.9}, std::pair{2.0f, std::sqrt(3.0) / (1.0 + std::sqrt(3.0))}}) {
    p.temperature = t;
    const double sigma = std::sqrt(want * (1.0 - want) / 20000.0);
    EXPECT_NEAR(share_of_one(p, 20000), want, 5.0 * sigma) << "T = " << t;
  }
}

// What the filters keep, not only what they cut: top-k 2 of three logits draws both kept ids and never the
// third; top-p 0.8 over {0.6, 0.3, 0.1} keeps the first two (0.6 alone falls short), so both are drawn;
// min-p 0.4 keeps p >= 0.24, tokens 0 and 1.
TEST(Sampler, FiltersKeepWhatTheyShould) {
  const auto draws = [](SamplingParams p, std::vector<float> logits) {
    p.temperature = 1.0f;
    p.seed = 11;
    Sampler s(p, {});
    std::map<int32_t, int> seen;
    for (int i = 0; i < 400; ++i) {
      auto l = logits;
      seen[s.sample(l)]++;
    }
    return seen;
  };
  const std::vector<float> three = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  SamplingParams k, tp, mp;
  k.top_k = 2;
  tp.top_p = 0.8f;
  mp.min_p = 0.4f;
  for (const SamplingParams& p : {k, tp, mp}) {
    const auto seen = draws(p, three);
    EXPECT_GT(seen.count(0), 0u) << p.top_k << " " << p.top_p << " " << p.min_p;
    EXPECT_GT(seen.count(1), 0u) << p.top_k << " " << p.top_p << " " << p.min_p;
    EXPECT_EQ(seen.count(2), 0u) << p.top_k << " " << p.top_p << " " << p.min_p;
  }
  // min-p is relative to the top token: taken as an absolute threshold, 0.45 would cut token 1 (0.3 < 0.45).
  SamplingParams mp_rel;
  mp_rel.min_p = 0.45f;  // keeps p >= 0.27
  EXPECT_GT(draws(mp_rel, three).count(1), 0u);
}

// Rows that are not all finite (an overflowing head, a NaN from a bad weight): NaN is never drawn, an
// infinite logit takes all the mass, and a row with nothing finite gives the lowest id, as greedy does.
TEST(Sampler, NonFiniteLogitsAreDrawnSensibly) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 5;
  Sampler s(p, {});
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < 100; ++i) {
    std::vector<float> pos_inf = {0.0f, inf, -1.0f};
    EXPECT_EQ(s.sample(pos_inf), 1);
    std::vector<float> with_nan = {nan, 0.0f, 0.5f, nan};
    const int32_t t = s.sample(with_nan);
    EXPECT_TRUE(t == 1 || t == 2) << t;
    std::vector<float> none = {-inf, -inf, -inf};
    EXPECT_EQ(s.sample(none), 0);
    std::vector<float> all_nan = {nan, nan};
    EXPECT_EQ(s.sample(all_nan), 0);
  }
  SamplingParams k = p;
  k.top_k = 2;
  k.top_p = 0.9f;
  Sampler sk(k, {});
  for (int i = 0; i < 100; ++i) {
    std::vector<float> two_inf = {inf, 1.0f, inf, nan};
    const int32_t t = sk.sample(two_inf);
    EXPECT_TRUE(t == 0 || t == 2) << t;
  }
}

TEST(Sampler, InvalidParamsNameTheField) {
  SamplingParams p;
  p.top_p = 0.0f;
  try {
    Sampler s(p, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  p = {};
  p.temperature = -1.0f;
  EXPECT_THROW(Sampler(p, {}), Error);
}

}  // namespace
}  // namespace kimirt::runtime
