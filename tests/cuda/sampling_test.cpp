// Sampling: greedy ties, determinism per (seed, step), support of top-k / top-p / min-p, and the
// empirical distribution of temperature sampling against the softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "kimirt/base/error.h"
#include "kimirt/cuda/sampling.h"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

using test::download;
using test::upload;

std::vector<int32_t> run(const std::vector<float>& logits, int64_t vocab, const std::vector<SamplingParams>& ps) {
  DeviceBuffer dl = upload(logits), dp = upload(ps), ids = test::poisoned(ps.size() * 4);
  sample(nullptr, dl.as<float>(), vocab, ps.size(), vocab, 0, dp.as<SamplingParams>(), ids.as<int32_t>());
  return download<int32_t>(ids.data(), ps.size());
}

TEST(Sampling, GreedyTakesLowestIdOnTies) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 163840;
  std::vector<float> l = test::random_vec(vocab, 1);
  l[70000] = 5.0f, l[123] = 5.0f, l[160000] = 5.0f;
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(run(l, vocab, {p}), std::vector<int32_t>{123});
}

TEST(Sampling, DeterministicPerSeedAndStepAndRespectsFilters) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 50000;
  std::vector<float> l = test::random_vec(vocab, 2, -5, 5);
  std::vector<float> sorted = l;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  std::vector<SamplingParams> ps;
  for (int i = 0; i < 400; ++i) {
    SamplingParams p;
    p.temperature = 0.8f;
    p.seed = 42;
    p.step = i;
    p.top_k = i % 4 == 0 ? 20 : 0;
    p.top_p = i % 4 == 1 ? 0.3f : 1.0f;
    p.min_p = i % 4 == 2 ? 0.2f : 0.0f;
    ps.push_back(p);
  }
  std::vector<float> rows;
  for (size_t i = 0; i < ps.size(); ++i) rows.insert(rows.end(), l.begin(), l.end());
  const auto a = run(rows, vocab, ps), b = run(rows, vocab, ps);
  EXPECT_EQ(a, b) << "same seed and step, same token";
  // Kept sets from the host.
  const float zmax = sorted[0] / 0.8f;
  double total = 0;
  for (float v : l) total += std::exp(v / 0.8 - zmax);
  double cum = 0;
  float top_p_min = sorted[0];
  for (float v : sorted) {
    cum += std::exp(v / 0.8 - zmax);
    top_p_min = v;
    if (cum >= 0.3 * total) break;
  }
  std::set<int32_t> distinct;
  for (size_t i = 0; i < ps.size(); ++i) {
    const float v = l[a[i]];
    if (i % 4 == 0) {
      EXPECT_GE(v, sorted[19]) << "top-k row " << i;
    } else if (i % 4 == 1) {
      EXPECT_GE(v, top_p_min) << "top-p row " << i;
    } else if (i % 4 == 2) {
      EXPECT_GE(v / 0.8f, zmax + std::log(0.2f) - 1e-5f) << "min-p row " << i;
    }
    distinct.insert(a[i]);
  }
  EXPECT_GT(distinct.size(), 5u) << "sampling is not stuck on one token";
}

TEST(Sampling, FrequenciesFollowTheSoftmax) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 8;
  const std::vector<float> l = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f, 1.5f, -2.0f, 0.2f};
  const int n = 40000;
  std::vector<float> rows;
  std::vector<SamplingParams> ps(n);
  for (int i = 0; i < n; ++i) {
    rows.insert(rows.end(), l.begin(), l.end());
    ps[i].temperature = 1.0f;
    ps[i].seed = 7;
    ps[i].step = i;
  }
  const auto ids = run(rows, vocab, ps);
  std::vector<int> count(vocab, 0);
  for (int id : ids) {
    ASSERT_TRUE(id >= 0 && id < vocab);
    ++count[id];
  }
  double den = 0;
  for (float v : l) den += std::exp(v);
  for (int i = 0; i < vocab; ++i) {
    const double p = std::exp(l[i]) / den;
    const double sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(count[i], n * p, 5 * sd) << "token " << i;  // 5 sigma: fails by chance ~1e-6
  }
}

TEST(Sampling, ValidatesParams) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(validate(p), Error);
  p = {};
  p.temperature = -1.0f;
  EXPECT_THROW(validate(p), Error);
  p = {};
  p.min_p = 1.0f;
  EXPECT_THROW(validate(p), Error);
  EXPECT_NO_THROW(validate(SamplingParams{}));
}

}  // namespace
}  // namespace kimirt::cuda
