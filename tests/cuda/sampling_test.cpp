// Sampling: greedy ties, determinism per (seed, step), support of top-k / top-p / min-p, the empirical
// distribution of temperature sampling against the softmax, and the LM head's refusal of filters on a
// vocabulary shard.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kimirt/base/error.h"
#include "kimirt/cpu/lm_head.h"
#include "kimirt/cuda/gemm_dispatch.h"
#include "kimirt/cuda/gemm_lt.h"
#include "kimirt/cuda/lm_head.h"
#include "kimirt/cuda/nccl_comm.h"
#include "kimirt/cuda/sampling.h"
#include "kimirt/cuda/stream.h"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

using test::download;
using test::upload;

// With a workspace, small batches split each row over several blocks; without, one block per row.
std::vector<int32_t> run(const std::vector<float>& logits, int64_t vocab, const std::vector<SamplingParams>& ps,
                         bool workspace = true) {
  DeviceBuffer dl = upload(logits), dp = upload(ps), ids = test::poisoned(ps.size() * 4);
  const uint64_t ws_bytes = sampling_workspace_bytes(ps.size());
  DeviceBuffer ws(ws_bytes);
  init_sampling_workspace(ws.data(), ws_bytes, nullptr);
  sample(nullptr, dl.as<float>(), vocab, ps.size(), vocab, 0, dp.as<SamplingParams>(), ids.as<int32_t>(), nullptr,
         workspace ? ws.data() : nullptr, workspace ? ws_bytes : 0);
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
  std::set<int32_t> distinct, per_filter[3];
  for (size_t i = 0; i < ps.size(); ++i) {
    const float v = l[a[i]];
    if (i % 4 < 3) per_filter[i % 4].insert(a[i]);
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
  // Each filter keeps a set, not its argmax alone (top-k 20; top-p 0.3 and min-p 0.2 keep hundreds and
  // thousands of these 50000 logits), which the lower bounds above would not see.
  for (int f = 0; f < 3; ++f) EXPECT_GT(per_filter[f].size(), 10u) << "filter " << f << " (top-k, top-p, min-p)";
}

// Rows split over up to 16 blocks pick exactly the tokens of one block per row (integer sums, joined in
// block order), for every filter; greedy ties across block boundaries go to the lowest id; the workspace
// is reusable (each call leaves it zeroed).
TEST(Sampling, BlocksPerRowDoNotChangeTheToken) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 163840;
  std::vector<SamplingParams> ps;
  for (int i = 0; i < 12; ++i) {
    SamplingParams p;
    p.temperature = i == 0 ? 0.0f : 0.7f + 0.05f * i;
    p.seed = 1000 + i;
    p.step = 3 * i;
    p.top_k = (i % 3 == 1) ? 50 : (i % 3 == 2 ? 2000 : 0);
    p.top_p = (i % 4 == 1) ? 0.9f : (i % 4 == 2 ? 0.2f : 1.0f);
    p.min_p = (i % 5 == 3) ? 0.05f : 0.0f;
    ps.push_back(p);
  }
  std::vector<float> rows;
  for (size_t i = 0; i < ps.size(); ++i) {
    std::vector<float> r = test::random_vec(vocab, 40 + i, -10, 10);
    if (i == 0) r[150000] = 20.0f, r[20000] = 20.0f;  // greedy tie across blocks
    rows.insert(rows.end(), r.begin(), r.end());
  }
  const auto single = run(rows, vocab, ps, false);
  EXPECT_EQ(single[0], 20000);
  for (int batch : {1, 3, 12}) {
    std::vector<float> sub(rows.begin(), rows.begin() + batch * vocab);
    std::vector<SamplingParams> sp(ps.begin(), ps.begin() + batch);
    const auto multi = run(sub, vocab, sp, true);
    for (int i = 0; i < batch; ++i) EXPECT_EQ(multi[i], single[i]) << "row " << i << " in a batch of " << batch;
  }
  // Twice through one workspace.
  DeviceBuffer dl = upload(rows), dp = upload(ps), ids = test::poisoned(ps.size() * 4);
  const uint64_t ws_bytes = sampling_workspace_bytes(ps.size());
  DeviceBuffer ws(ws_bytes);
  init_sampling_workspace(ws.data(), ws_bytes, nullptr);
  for (int rep = 0; rep < 2; ++rep) {
    poison(ids.data(), ids.size(), nullptr);  // the second call must write the ids itself
    sample(nullptr, dl.as<float>(), vocab, ps.size(), vocab, 0, dp.as<SamplingParams>(), ids.as<int32_t>(), nullptr,
           ws.data(), ws_bytes);
    EXPECT_EQ(download<int32_t>(ids.data(), ps.size()), single) << "call " << rep;
  }
}

// Top-k keeps exactly the k largest (here k = 3 of a 163840-token row split over 16 blocks): every pick is
// one of them, and all three turn up.
TEST(Sampling, TopKAcrossBlocksKeepsTheKLargest) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 163840;
  std::vector<float> l = test::random_vec(vocab, 77, -5, 5);
  l[5] = 9.0f, l[81920] = 9.1f, l[163839] = 9.2f;
  std::set<int32_t> seen;
  for (int step = 0; step < 60; ++step) {
    SamplingParams p;
    p.temperature = 1.0f, p.top_k = 3, p.seed = 9, p.step = step;
    const int32_t id = run(l, vocab, {p})[0];
    EXPECT_TRUE(id == 5 || id == 81920 || id == 163839) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 3u);
}

// A batch of at least the SM count gives each row one block, which filters a candidate list gathered from
// the row (top-k <= 256); the tokens equal those of the same rows sampled one at a time (split over 16
// blocks). One row has more ties at its threshold than the list holds and takes the general path.
TEST(Sampling, LargeBatchesPickTheTokensOfSingleRows) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 163840;
  const int batch = 140;
  std::vector<SamplingParams> ps;
  std::vector<float> rows;
  for (int i = 0; i < batch; ++i) {
    SamplingParams p;
    p.temperature = 0.6f + 0.01f * i;
    p.seed = 500 + i;
    p.step = i;
    p.top_k = i % 2 == 0 ? 50 : (i % 3 == 0 ? 256 : 7);
    p.top_p = i % 4 == 1 ? 0.8f : 1.0f;
    p.min_p = i % 5 == 2 ? 0.02f : 0.0f;
    ps.push_back(p);
    std::vector<float> r = test::random_vec(vocab, 900 + i, -8, 8);
    if (i == 3) {
      for (int j = 0; j < 3000; ++j) r[j * 50] = 12.0f;  // 3000 ties at the top: more than a list holds
    }
    rows.insert(rows.end(), r.begin(), r.end());
  }
  const auto together = run(rows, vocab, ps, true);
  for (int i = 0; i < batch; ++i) {
    const std::vector<float> one(rows.begin() + i * vocab, rows.begin() + (i + 1) * vocab);
    EXPECT_EQ(together[i], run(one, vocab, {ps[i]}, true)[0]) << "row " << i;
  }
  EXPECT_EQ(together[3] % 50, 0) << "a tied top value";
}

// The sampler as a decode graph uses it: captured once over fixed buffers (three rows, so each row is split over
// blocks that meet at barriers in the workspace), then replayed as each step writes new logits and params
// (seeds, steps, temperatures, filters) into them. Each replay gives the ids of an eager call on the same
// inputs with a workspace of its own, and leaves the graph's barrier counters at zero as every call must.
TEST(Sampling, GraphReplaysFollowNewParams) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 163840, rows = 3;
  DeviceBuffer dl = test::poisoned(rows * vocab * 4), dp(rows * sizeof(SamplingParams)), ids = test::poisoned(rows * 4);
  const uint64_t ws_bytes = sampling_workspace_bytes(rows);
  DeviceBuffer ws(ws_bytes);
  Stream stream;
  init_sampling_workspace(ws.data(), ws_bytes, stream);
  const auto call = [&] {
    sample(stream, dl.as<float>(), vocab, rows, vocab, 0, dp.as<SamplingParams>(), ids.as<int32_t>(), nullptr,
           ws.data(), ws_bytes);
  };
  const auto step_inputs = [&](int k, std::vector<float>& logits, std::vector<SamplingParams>& ps) {
    logits = test::random_vec(rows * vocab, 700 + k, -6, 6);
    ps.assign(rows, SamplingParams{});
    ps[0].temperature = 0.0f;  // greedy
    ps[1].temperature = 0.7f + 0.1f * k, ps[1].seed = 41, ps[1].step = k;
    ps[2].temperature = 1.0f, ps[2].seed = 1000 + k, ps[2].step = 2 * k, ps[2].top_k = 20 + k, ps[2].top_p = 0.9f;
    KIMIRT_CUDA_CHECK(cudaMemcpy(dl.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    KIMIRT_CUDA_CHECK(cudaMemcpy(dp.data(), ps.data(), ps.size() * sizeof(SamplingParams), cudaMemcpyHostToDevice));
    // The legacy stream's copies (from pageable memory they may return before the DMA lands) do not order the
    // non-blocking stream the sampler runs on.
    KIMIRT_CUDA_CHECK(cudaDeviceSynchronize());
  };
  std::vector<float> logits;
  std::vector<SamplingParams> ps;
  step_inputs(0, logits, ps);
  call();  // kernel attributes set outside the capture
  stream.synchronize();
  const test::CapturedGraph graph(stream, call);
  for (int k = 1; k <= 4; ++k) {
    step_inputs(k, logits, ps);
    poison(ids.data(), ids.size(), stream);
    graph.launch();
    stream.synchronize();
    EXPECT_EQ(download<int32_t>(ids.data(), rows), run(logits, vocab, ps)) << "step " << k;
    // Each row's scratch starts with its barrier counter, which every call must leave at zero (the rest is
    // written before it is read).
    const auto left = download<uint32_t>(ws.data(), ws_bytes / 4);
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(left[r * (ws_bytes / 4 / rows)], 0u) << "row " << r << ", step " << k;
  }
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

// Temperature and the filters change the distribution as sampling.h says: the kept set {z >= tau} (tau the
// largest of the top-k, top-p and min-p thresholds of z = logits / T), drawn from the softmax of z renormalized
// over it. Distinct logits, so no tie sits at a cut; every kept token within 5 sigma, no other token ever.
TEST(Sampling, FrequenciesFollowTheFilteredSoftmax) {
  KIMIRT_REQUIRE_GPU();
  const std::vector<float> l = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f, 1.5f, -2.0f, 0.2f};
  const int64_t vocab = static_cast<int64_t>(l.size());
  struct Case {
    float t;
    int32_t k;
    float p, min_p;
  };
  const Case cases[] = {{0.5f, 0, 1.0f, 0.0f}, {2.0f, 0, 1.0f, 0.0f},  {1.0f, 3, 1.0f, 0.0f}, {1.0f, 0, 0.7f, 0.0f},
                        {0.7f, 0, 1.0f, 0.2f}, {1.3f, 5, 0.9f, 0.05f}, {2.0f, 6, 0.8f, 0.0f}};
  const int n = 40000;
  for (const Case& c : cases) {
    // The expected distribution, in double.
    std::vector<double> z(l.begin(), l.end());
    for (double& v : z) v /= c.t;
    std::vector<double> sorted = z;
    std::sort(sorted.rbegin(), sorted.rend());
    double tau = -INFINITY;
    if (c.k > 0 && c.k < vocab) tau = sorted[static_cast<size_t>(c.k - 1)];
    if (c.p < 1.0f) {
      double mass = 0, seen = 0;
      for (double v : sorted)
        if (v >= tau) mass += std::exp(v - sorted[0]);
      for (double v : sorted) {
        if (v < tau) break;
        seen += std::exp(v - sorted[0]);
        if (seen >= c.p * mass) {
          tau = std::max(tau, v);
          break;
        }
      }
    }
    if (c.min_p > 0.0f) tau = std::max(tau, sorted[0] + std::log(static_cast<double>(c.min_p)));
    std::vector<double> want(vocab, 0.0);
    double den = 0;
    for (int64_t i = 0; i < vocab; ++i)
      if (z[i] >= tau) den += want[i] = std::exp(z[i] - sorted[0]);
    std::vector<float> rows;
    std::vector<SamplingParams> ps(n);
    for (int i = 0; i < n; ++i) {
      rows.insert(rows.end(), l.begin(), l.end());
      ps[i].temperature = c.t, ps[i].top_k = c.k, ps[i].top_p = c.p, ps[i].min_p = c.min_p;
      ps[i].seed = 11;
      ps[i].step = i;
    }
    std::vector<int> count(vocab, 0);
    for (int id : run(rows, vocab, ps)) {
      ASSERT_TRUE(id >= 0 && id < vocab);
      ++count[id];
    }
    for (int64_t i = 0; i < vocab; ++i) {
      const double p = want[i] / den;
      const std::string what = fmt::format("T {} top-k {} top-p {} min-p {}: token {}", c.t, c.k, c.p, c.min_p, i);
      if (p == 0.0) {
        EXPECT_EQ(count[i], 0) << what << " is filtered out";
        continue;
      }
      EXPECT_NEAR(count[i], n * p, 5 * std::sqrt(n * p * (1 - p)) + 1) << what;
    }
  }
}

// The filters over the full 163840-token vocabulary: ten tokens hold the mass (0.3, 0.2, 0.15, 0.1, 0.08, 0.07,
// 0.05, 0.03, 0.01, 0.01; every other token 30 nats below the least of them), and top-p 0.8 keeps the first five
// (0.83 of the mass), min-p 0.2 the first six (p >= 0.06), top-k 3 three. The kept tokens' frequencies follow
// the softmax renormalized over them (5 sigma) and no other token is drawn. A threshold found too tight or too
// loose over the radix selection's passes and blocks shows here; the 8-token tests above fit in one pass.
TEST(Sampling, FrequenciesAtTheFullVocabulary) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 163840, rows = 256;
  const int calls = 32;
  const std::vector<double> mass = {0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.03, 0.01, 0.01};
  std::vector<int64_t> id(mass.size());
  std::vector<float> row(vocab, static_cast<float>(std::log(0.01) - 30.0));
  for (size_t i = 0; i < mass.size(); ++i) {
    id[i] = 1000 + 16381 * static_cast<int64_t>(i);
    row[id[i]] = static_cast<float>(std::log(mass[i]));
  }
  std::vector<float> logits;
  for (int64_t r = 0; r < rows; ++r) logits.insert(logits.end(), row.begin(), row.end());
  DeviceBuffer dl = upload(logits), ids = test::poisoned(rows * 4);
  const uint64_t ws_bytes = sampling_workspace_bytes(rows);
  DeviceBuffer ws(ws_bytes);
  init_sampling_workspace(ws.data(), ws_bytes, nullptr);
  struct Case {
    int32_t k;
    float p, min_p;
    size_t kept;
  };
  for (const Case& c : {Case{0, 0.8f, 0.0f, 5}, Case{0, 1.0f, 0.2f, 6}, Case{3, 1.0f, 0.0f, 3}}) {
    std::map<int64_t, int> count;
    for (int call = 0; call < calls; ++call) {
      std::vector<SamplingParams> ps(rows);
      for (int64_t r = 0; r < rows; ++r) {
        ps[r].temperature = 1.0f, ps[r].top_k = c.k, ps[r].top_p = c.p, ps[r].min_p = c.min_p;
        ps[r].seed = 17, ps[r].step = call * rows + r;
      }
      DeviceBuffer dp = upload(ps);
      sample(nullptr, dl.as<float>(), vocab, rows, vocab, 0, dp.as<SamplingParams>(), ids.as<int32_t>(), nullptr,
             ws.data(), ws_bytes);
      for (int32_t t : download<int32_t>(ids.data(), rows)) ++count[t];
    }
    const int n = calls * static_cast<int>(rows);
    double den = 0;
    for (size_t i = 0; i < c.kept; ++i) den += mass[i];
    const std::string what = fmt::format("top-k {} top-p {} min-p {}", c.k, c.p, c.min_p);
    int64_t in_kept = 0;
    for (size_t i = 0; i < c.kept; ++i) {
      const double p = mass[i] / den;
      EXPECT_NEAR(count[id[i]], n * p, 5 * std::sqrt(n * p * (1 - p)) + 1) << what << ": token " << id[i];
      in_kept += count[id[i]];
    }
    EXPECT_EQ(in_kept, n) << what << ": tokens outside the kept set were drawn";
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
  p.min_p = 1.1f;
  EXPECT_THROW(validate(p), Error);
  p.min_p = 1.0f;  // the CPU sampler's range: keeps the tokens tied with the most likely one
  EXPECT_NO_THROW(validate(p));
  EXPECT_NO_THROW(validate(SamplingParams{}));
  // Any finite temperature >= 0, as the CPU sampler takes it; not NaN or infinity.
  p = {};
  p.temperature = 1e31f;
  EXPECT_NO_THROW(validate(p));
  for (const float t : {INFINITY, NAN}) {
    p.temperature = t;
    EXPECT_THROW(validate(p), Error) << t;
  }
}

TEST(Sampling, RejectsOffsetsOutsideInt32Ids) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 1024;
  DeviceBuffer dl(vocab * 4), dp = upload(std::vector<SamplingParams>(1)), ids(16);
  for (const int64_t offset : {int64_t{-1}, (int64_t{1} << 31) - vocab + 1}) {
    EXPECT_THROW(sample(nullptr, dl.as<float>(), vocab, 1, vocab, offset, dp.as<SamplingParams>(), ids.as<int32_t>()),
                 Error)
        << "vocab_offset " << offset;
  }
  const int64_t last = (int64_t{1} << 31) - vocab;  // the largest id is INT32_MAX
  KIMIRT_CUDA_CHECK(cudaMemset(dl.data(), 0, vocab * 4));
  SamplingParams g;
  g.temperature = 0.0f;
  DeviceBuffer dg = upload(std::vector<SamplingParams>{g});
  sample(nullptr, dl.as<float>(), vocab, 1, vocab, last, dg.as<SamplingParams>(), ids.as<int32_t>());
  EXPECT_EQ(download<int32_t>(ids.data(), 1)[0], static_cast<int32_t>(last)) << "greedy tie: the lowest id";
}

// min_p = 1 keeps only the tokens tied with the most likely one.
TEST(Sampling, MinPOneKeepsTheTopTies) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 163840;
  std::vector<float> l = test::random_vec(vocab, 11, -5, 5);
  l[777] = 8.0f, l[150001] = 8.0f;
  std::vector<SamplingParams> ps(64);
  for (int i = 0; i < 64; ++i) ps[i].temperature = 1.0f, ps[i].min_p = 1.0f, ps[i].seed = 3, ps[i].step = i;
  std::vector<float> rows;
  for (size_t i = 0; i < ps.size(); ++i) rows.insert(rows.end(), l.begin(), l.end());
  std::set<int32_t> seen;
  for (int32_t id : run(rows, vocab, ps)) {
    EXPECT_TRUE(id == 777 || id == 150001) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 2u);
}

// -0 and +0 are one value: top-k 2 over {1, -0 (id 1), +0 (id 2), negatives} has its threshold at 0 and keeps
// both zeros, as the CPU sampler keeps id 1 (ties go to the lower id). With a key per bit pattern, -0 sorted
// below +0 and was dropped.
TEST(Sampling, TopKKeepsBothZerosAtAZeroThreshold) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 4096;
  std::vector<float> l = test::random_vec(vocab, 13, -9, -1);
  l[0] = 1.0f, l[1] = -0.0f, l[2] = 0.0f;
  std::vector<SamplingParams> ps(64);
  for (int i = 0; i < 64; ++i) ps[i].top_k = 2, ps[i].seed = 17, ps[i].step = i;
  std::vector<float> rows;
  for (size_t i = 0; i < ps.size(); ++i) rows.insert(rows.end(), l.begin(), l.end());
  std::set<int32_t> seen;
  for (int32_t id : run(rows, vocab, ps)) {
    EXPECT_TRUE(id <= 2) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2}));  // each zero ~21% of draws: missing from 64 in ~3e-7
}

// One logit 40 above all others: the others' Gumbel noise (at most -ln(-ln(1 - 2^-24)) ≈ 16.6) cannot
// overcome that, so every row picks it. With the 24-bit uniform that could round to u == 1 (noise +inf),
// about 1% of rows at this vocabulary picked a uniformly random token instead (~20 of these 2048).
TEST(Sampling, NoTokenGetsInfiniteNoise) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 163840, rows = 2048, stride = 53;
  // The logits on the device (1.3 GiB; no host copy): zero, then 40 at id 5 + 53·row of each row.
  DeviceBuffer dl(rows * vocab * 4);
  KIMIRT_CUDA_CHECK(cudaMemset(dl.data(), 0, dl.size()));
  const std::vector<float> top(rows, 40.0f);
  KIMIRT_CUDA_CHECK(
      cudaMemcpy2D(dl.as<float>() + 5, (vocab + stride) * 4, top.data(), 4, 4, rows, cudaMemcpyHostToDevice));
  std::vector<SamplingParams> ps(rows);
  for (int64_t i = 0; i < rows; ++i) ps[i].temperature = 1.0f, ps[i].seed = 0x9e3779b9ull * (i + 1), ps[i].step = i;
  DeviceBuffer dp = upload(ps), ids = test::poisoned(rows * 4);
  sample(nullptr, dl.as<float>(), vocab, rows, vocab, 0, dp.as<SamplingParams>(), ids.as<int32_t>());
  const auto got = download<int32_t>(ids.data(), rows);
  int wrong = 0;
  for (int64_t i = 0; i < rows; ++i) wrong += got[i] != 5 + stride * i;
  EXPECT_EQ(wrong, 0) << "rows that did not pick their +40 logit, of " << rows;
}

// Temperatures below kMinTemperature are greedy. Before, z = v/T overflowed: 50/T and 60/T both +inf for
// T = 1e-37 (1/T itself for T = 1e-40), and the lower id of the two won.
// Rows that are not all finite: NaN is never drawn, an infinite logit wins (the lowest id of several, where the
// CPU sampler draws among them: sampling.h), and a row with nothing above -inf gives its lowest id, NaN counting
// as -inf (as on the CPU). Every filter path: one block and split rows, the candidate list (top-k), top-p and
// min-p.
TEST(Sampling, NonFiniteLogitsAreDrawnSensibly) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 163840;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  enum class Rest { kRandom, kNegInf, kNaN };  // every value the row does not set
  struct Row {
    std::vector<std::pair<int, float>> set;
    Rest rest;
    std::vector<int32_t> allowed;
  };
  const Row rows[] = {
      {{{70000, inf}}, Rest::kRandom, {70000}},
      {{{150000, inf}, {900, inf}}, Rest::kRandom, {900}},
      {{}, Rest::kNegInf, {0}},
      {{{5, 3.0f}, {160000, 3.5f}}, Rest::kNaN, {5, 160000}},
      {{{0, nan}, {3, nan}}, Rest::kNegInf, {0}},  // NaN first: still the lowest id of a row without finite values
      {{{7, -inf}}, Rest::kNaN, {0}},
  };
  for (const Row& row : rows) {
    std::vector<float> l = row.rest == Rest::kRandom ? test::random_vec(vocab, 7, -5, 5)
                                                     : std::vector<float>(vocab, row.rest == Rest::kNaN ? nan : -inf);
    for (const auto& [i, v] : row.set) l[static_cast<size_t>(i)] = v;
    for (const bool workspace : {false, true}) {
      for (int f = 0; f < 4; ++f) {
        SamplingParams p;
        p.temperature = 0.8f;
        p.seed = 11 + f;
        p.top_k = f == 1 ? 40 : 0;
        p.top_p = f == 2 ? 0.9f : 1.0f;
        p.min_p = f == 3 ? 0.05f : 0.0f;
        const int32_t id = run(l, vocab, {p}, workspace)[0];
        EXPECT_NE(std::find(row.allowed.begin(), row.allowed.end(), id), row.allowed.end())
            << "got " << id << ", filters " << f << (workspace ? ", split rows" : ", one block");
      }
    }
  }
}

TEST(Sampling, TinyTemperaturesPickTheArgmax) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 163840;
  std::vector<float> l = test::random_vec(vocab, 5, -1, 1);
  l[1000] = 50.0f, l[140000] = 60.0f;
  std::vector<SamplingParams> ps;
  for (const float t : {1e-40f, 1e-37f, 1e-20f, 0.5f * kMinTemperature, kMinTemperature}) {
    SamplingParams p;
    p.temperature = t, p.seed = ps.size() + 1;
    ps.push_back(p);
    p.top_k = 20, p.top_p = 0.9f, p.min_p = 0.1f;  // the filters' paths too
    ps.push_back(p);
  }
  std::vector<float> rows;
  for (size_t i = 0; i < ps.size(); ++i) rows.insert(rows.end(), l.begin(), l.end());
  for (const bool ws : {true, false}) {
    const auto got = run(rows, vocab, ps, ws);
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(got[i], 140000) << "T " << ps[i].temperature << ", row " << i << (ws ? ", split rows" : "");
    }
  }
}

// The LM head's logits against an fp64 product of the same bf16 inputs, at K3's hidden 7168: a rank's
// shard of the 163840-id vocabulary (row stride past the shard), then the whole vocabulary for one row,
// whose greedy id must be the argmax of the logits (fp32 sums of 7168 products: ≤ 1e-5 relative).
TEST(LmHead, LogitsAgainstTheHostAndGreedyTakesTheirArgmax) {
  KIMIRT_REQUIRE_GPU();
  const int64_t hidden = 7168, total = 163840;
  DeviceBuffer ws(8 << 20), sws(8 << 20);
  GemmLt lt(ws.data(), ws.size());
  Linear linear(lt, sws.data(), sws.size(), query_device(0).sm_count);
  DeviceBuffer w(total * hidden * 2), x(5 * hidden * 2);
  fill_uniform(w.as<__nv_bfloat16>(), total * hidden, -0.05f, 0.05f, 41, nullptr);
  fill_uniform(x.as<__nv_bfloat16>(), 5 * hidden, -1, 1, 42, nullptr);
  const std::vector<float> hx = test::from_bf16(download<uint16_t>(x.data(), 5 * hidden));
  const std::vector<float> hw = test::from_bf16(download<uint16_t>(w.data(), total * hidden));
  auto reference = [&](int64_t row, int64_t id) {
    double acc = 0;
    for (int64_t k = 0; k < hidden; ++k) acc += double{hx[row * hidden + k]} * double{hw[id * hidden + k]};
    return acc;
  };
  // A shard: ids 40960 .. 61439, rows 0..4, stride 20488.
  {
    const VocabShard shard{40960, 20480, total};
    const int64_t m = 5, ld = shard.size + 8;
    DeviceBuffer logits = test::poisoned(m * ld * 4);
    lm_head_logits(linear, nullptr, x.as<__nv_bfloat16>(), m, hidden, w.as<__nv_bfloat16>() + shard.offset * hidden,
                   shard, logits.as<float>(), ld);
    const std::vector<float> got = download<float>(logits.data(), m * ld);
    double err = 0, norm = 0;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t i = 0; i < shard.size; ++i) {
        const double ref = reference(r, shard.offset + i), d = got[r * ld + i] - ref;
        ASSERT_TRUE(std::isfinite(got[r * ld + i])) << r << ", " << i;
        err += d * d;
        norm += ref * ref;
      }
      for (int64_t i = shard.size; i < ld; ++i) EXPECT_TRUE(std::isnan(got[r * ld + i])) << "past the shard: " << i;
    }
    EXPECT_LE(std::sqrt(err / norm), 1e-5);
  }
  // The whole vocabulary, one row: the logits, and greedy's id.
  {
    DeviceBuffer logits = test::poisoned(total * 4), ids = test::poisoned(4);
    std::vector<SamplingParams> ps(1);
    ps[0].temperature = 0.0f;
    DeviceBuffer dp = upload(ps);
    lm_head_sample(linear, nullptr, x.as<__nv_bfloat16>() + 3 * hidden, 1, hidden, w.as<__nv_bfloat16>(),
                   VocabShard{0, total, total}, logits.as<float>(), total, dp.as<SamplingParams>(), ids.as<int32_t>());
    const std::vector<float> got = download<float>(logits.data(), total);
    double err = 0, norm = 0;
    for (int64_t i = 0; i < total; ++i) {
      const double ref = reference(3, i), d = got[i] - ref;
      err += d * d;
      norm += ref * ref;
    }
    EXPECT_LE(std::sqrt(err / norm), 1e-5);
    int32_t want = 0;
    cpu::argmax_rows(got.data(), 1, total, &want);
    EXPECT_EQ(download<int32_t>(ids.data(), 1)[0], want);
  }
}

// The seed is used: one row of logits drawn at 64 seeds gives many different tokens, and a seed gives the same
// token wherever its row sits in the batch (each request has its own generator).
TEST(Sampling, SeedsDrawDifferentTokensAndTheSameSeedTheSameToken) {
  KIMIRT_REQUIRE_GPU();
  const int64_t vocab = 1000, rows = 64;
  const std::vector<float> row = test::random_vec(vocab, 51, -1, 1);  // flat-ish: ~1000 plausible tokens
  std::vector<float> logits;
  for (int64_t r = 0; r < rows; ++r) logits.insert(logits.end(), row.begin(), row.end());
  std::vector<SamplingParams> ps(rows);
  for (int64_t r = 0; r < rows; ++r) ps[r].temperature = 1.0f, ps[r].seed = 1000 + r, ps[r].step = 7;
  const std::vector<int32_t> a = run(logits, vocab, ps);
  EXPECT_GE(std::set<int32_t>(a.begin(), a.end()).size(), 40u) << "64 seeds drew too few distinct tokens";
  std::reverse(ps.begin(), ps.end());
  const std::vector<int32_t> b = run(logits, vocab, ps, /*workspace=*/false);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(b[rows - 1 - r], a[r]) << "seed " << 1000 + r;
}

// More rows than sample() takes are refused before the logits GEMM is queued, on the whole vocabulary as on a
// shard: a refused call leaves the stream as it was (the capture records no node).
TEST(Sampling, LmHeadRefusesMoreRowsThanSampleTakesBeforeQueuing) {
  KIMIRT_REQUIRE_GPU();
  const int64_t m = 65536, hidden = 64, vocab = 16;
  DeviceBuffer ws(8 << 20), sws(8 << 20);
  GemmLt lt(ws.data(), ws.size());
  Linear linear(lt, sws.data(), sws.size(), query_device(0).sm_count);
  DeviceBuffer x(m * hidden * 2), w(vocab * hidden * 2), logits(m * vocab * 4), ids(m * 4);
  DeviceBuffer dp = upload(std::vector<SamplingParams>(m));
  Stream stream;
  const auto [what, nodes] = test::queued_by(stream, [&] {
    lm_head_sample(linear, stream, x.as<__nv_bfloat16>(), m, hidden, w.as<__nv_bfloat16>(), VocabShard{0, vocab, vocab},
                   logits.as<float>(), vocab, dp.as<SamplingParams>(), ids.as<int32_t>());
  });
  EXPECT_NE(what.find("lm_head: 65536 rows, sample() takes at most 65535"), std::string::npos) << what;
  EXPECT_EQ(nodes, 0u) << "work queued before the refusal";
}

// A sharded call: temperature-only rows are sampled on the shard and joined; once any row is filtered, every
// row is sampled from the gathered vocabulary; a call without what that needs is refused before anything runs.
// The fake cross step stands for a second rank whose logits are all -inf, so every id must be this shard's.
TEST(Sampling, ShardedLmHeadJoinsOrGathers) {
  KIMIRT_REQUIRE_GPU();
  const int64_t m = 2, hidden = 128, total = 2048, size = 1024;
  struct FakeCross : CrossShard {
    int joins = 0, gathers = 0;
    int64_t size = 0;
    int64_t max_rows() const override { return 2; }
    void combine(cudaStream_t, float*, int32_t*, int64_t) override { ++joins; }
    void gather_logits(cudaStream_t stream, const float* shard, int64_t ld_shard, int64_t rows, float* full,
                       int64_t ld_full) override {
      ++gathers;
      std::vector<float> other(rows * ld_full, -INFINITY);
      KIMIRT_CUDA_CHECK(cudaMemcpy(full, other.data(), other.size() * 4, cudaMemcpyHostToDevice));
      KIMIRT_CUDA_CHECK(cudaMemcpy2DAsync(full + size, ld_full * 4, shard, ld_shard * 4, size * 4, rows,
                                          cudaMemcpyDeviceToDevice, stream));
    }
  } cross;
  cross.size = size;
  DeviceBuffer ws(8 << 20), sws(8 << 20);
  GemmLt lt(ws.data(), ws.size());
  Linear linear(lt, sws.data(), sws.size(), query_device(0).sm_count);
  DeviceBuffer x(m * hidden * 2), w(size * hidden * 2), logits(m * size * 4), ids(m * 4), scores(m * 4),
      full(m * total * 4);
  fill_uniform(x.as<__nv_bfloat16>(), m * hidden, -1, 1, 1, nullptr);
  fill_uniform(w.as<__nv_bfloat16>(), size * hidden, -0.1f, 0.1f, 2, nullptr);
  std::vector<SamplingParams> ps(m);
  ps[1].top_k = 50;
  EXPECT_TRUE(uses_filters(ps[1], total));
  EXPECT_FALSE(uses_filters(ps[0], total));
  DeviceBuffer dp = upload(ps);
  const VocabShard shard{size, size, total};
  auto call = [&](const VocabShard& s, const ShardedSampling& tp) {
    poison(ids.data(), ids.size(), nullptr);  // each call's ids are its own
    lm_head_sample(linear, nullptr, x.as<__nv_bfloat16>(), m, hidden, w.as<__nv_bfloat16>(), s, logits.as<float>(),
                   size, dp.as<SamplingParams>(), ids.as<int32_t>(), tp);
  };
  EXPECT_THROW(call(shard, {.cross = &cross, .scratch_scores = scores.as<float>(), .any_filtered = true}),
               Error);                                                       // filtered, nowhere to gather
  EXPECT_THROW(call(shard, {.cross = &cross}), Error);                       // no score scratch to join
  EXPECT_THROW(call(shard, {.scratch_scores = scores.as<float>()}), Error);  // no cross step
  EXPECT_EQ(cross.joins + cross.gathers, 0);
  const auto shard_ids = [&] {
    for (int32_t id : download<int32_t>(ids.data(), m)) EXPECT_TRUE(id >= size && id < total) << id;
  };
  // Filtered: the gathered vocabulary, sampled whole.
  call(shard, {.cross = &cross, .any_filtered = true, .full_logits = full.as<float>(), .ld_full = total});
  EXPECT_EQ(cross.gathers, 1);
  EXPECT_EQ(cross.joins, 0);
  shard_ids();
  // Temperature-only rows on the shard: ids of the shard's slice, joined once.
  ps[1].top_k = 0;
  KIMIRT_CUDA_CHECK(cudaMemcpy(dp.data(), ps.data(), m * sizeof(SamplingParams), cudaMemcpyHostToDevice));
  call(shard, {.cross = &cross, .scratch_scores = scores.as<float>()});
  EXPECT_EQ(cross.joins, 1);
  shard_ids();
  // The whole vocabulary in one shard samples any filter, with no cross step.
  ps[1].top_k = 50;
  KIMIRT_CUDA_CHECK(cudaMemcpy(dp.data(), ps.data(), m * sizeof(SamplingParams), cudaMemcpyHostToDevice));
  call(VocabShard{0, size, size}, {});
  for (int32_t id : download<int32_t>(ids.data(), m)) EXPECT_TRUE(id >= 0 && id < size) << id;
}

// The cross-shard join alone, three ranks with candidates `stride` apart: per row the larger score, ties to the
// lower id whichever rank holds it, all -inf rows to the lowest id; the slots past `rows` (99, better than
// any) are never read.
TEST(Sampling, JoinCandidatesTakesTheBestScoreThenTheLowerId) {
  KIMIRT_REQUIRE_GPU();
  const int ranks = 3;
  const int64_t rows = 5, stride = 7;
  const float inf = INFINITY;
  const std::vector<float> scores = {1.0f, 2.0f, -inf, 5.0f, 0.5f,  99.0f, 99.0f,   // rank 0
                                     3.0f, 2.0f, -inf, 5.0f, 0.5f,  99.0f, 99.0f,   // rank 1
                                     2.0f, 1.0f, -inf, 4.0f, 0.75f, 99.0f, 99.0f};  // rank 2
  const std::vector<int32_t> ids = {10, 11, 12, 13, 14, 0, 0, 20, 5, 22, 9, 24, 0, 0, 30, 31, 3, 33, 34, 0, 0};
  DeviceBuffer ds = upload(scores), di = upload(ids), out_s = test::poisoned(rows * 4),
               out_i = test::poisoned(rows * 4);
  join_candidates(nullptr, ds.as<float>(), di.as<int32_t>(), ranks, stride, rows, out_s.as<float>(),
                  out_i.as<int32_t>());
  EXPECT_EQ(download<int32_t>(out_i.data(), rows), (std::vector<int32_t>{20, 5, 3, 9, 34}));
  EXPECT_EQ(download<float>(out_s.data(), rows), (std::vector<float>{3.0f, 2.0f, -inf, 5.0f, 0.75f}));
  EXPECT_THROW(join_candidates(nullptr, ds.as<float>(), di.as<int32_t>(), ranks, rows - 1, rows, out_s.as<float>(),
                               out_i.as<int32_t>()),
               Error)
      << "a stride below the rows";
}

// The vocabulary cut in two on one GPU: each half sampled with its offset and its scores, then joined
// (join_candidates), gives the ids and scores of the whole vocabulary sampled at once, for greedy rows and
// temperature rows (whose noise must be keyed by the global id, not the shard's), with and without the blocks'
// workspace. Greedy scores are the row's max logit. (TwoRanksSampleAsOneGpu checks the same over NCCL on two
// GPUs; this runs wherever one GPU does.)
TEST(Sampling, HalvesJoinedEqualTheWholeVocabulary) {
  KIMIRT_REQUIRE_GPU();
  const int64_t rows = 8, vocab = 163840, half = vocab / 2;
  std::vector<float> logits = test::random_vec(rows * vocab, 81, -4, 4);
  // Rows 6 (greedy) and 7: a first half of NaN and a second half of -inf. Nothing is finite, so the lowest id
  // wins, NaN counting as -inf: a shard of NaN alone must not offer its own NaN token as better than -inf.
  for (int64_t r = 6; r < 8; ++r)
    for (int64_t v = 0; v < vocab; ++v) logits[r * vocab + v] = v < half ? NAN : -INFINITY;
  std::vector<SamplingParams> ps(rows);
  for (int64_t r = 0; r < rows; ++r) {
    ps[r].temperature = r % 3 == 0 ? 0.0f : 0.6f + 0.2f * r;
    ps[r].seed = 1000 + r, ps[r].step = 3 * r;
  }
  DeviceBuffer dl = upload(logits), dp = upload(ps);
  const uint64_t ws_bytes = sampling_workspace_bytes(rows);
  DeviceBuffer ws(ws_bytes);
  init_sampling_workspace(ws.data(), ws_bytes, nullptr);
  for (const bool workspace : {false, true}) {
    SCOPED_TRACE(workspace ? "blocks sharing rows" : "a block per row");
    void* w = workspace ? ws.data() : nullptr;
    const uint64_t wb = workspace ? ws_bytes : 0;
    DeviceBuffer whole_i = test::poisoned(rows * 4), whole_s = test::poisoned(rows * 4);
    sample(nullptr, dl.as<float>(), vocab, rows, vocab, 0, dp.as<SamplingParams>(), whole_i.as<int32_t>(),
           whole_s.as<float>(), w, wb);
    DeviceBuffer part_i = test::poisoned(2 * rows * 4), part_s = test::poisoned(2 * rows * 4);
    for (int h = 0; h < 2; ++h) {
      sample(nullptr, dl.as<float>() + h * half, vocab, rows, half, h * half, dp.as<SamplingParams>(),
             part_i.as<int32_t>() + h * rows, part_s.as<float>() + h * rows, w, wb);
    }
    DeviceBuffer join_i = test::poisoned(rows * 4), join_s = test::poisoned(rows * 4);
    join_candidates(nullptr, part_s.as<float>(), part_i.as<int32_t>(), 2, rows, rows, join_s.as<float>(),
                    join_i.as<int32_t>());
    const auto ids = download<int32_t>(whole_i.data(), rows);
    const auto scores = download<float>(whole_s.data(), rows);
    EXPECT_EQ(download<int32_t>(join_i.data(), rows), ids);
    EXPECT_EQ(download<float>(join_s.data(), rows), scores);
    EXPECT_EQ(ids[6], 0);
    EXPECT_EQ(ids[7], 0);
    for (int64_t r = 0; r < 6; r += 3) {  // the greedy rows with finite logits
      const float mx = *std::max_element(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
      EXPECT_EQ(scores[r], mx) << "greedy row " << r;
      EXPECT_EQ(logits[r * vocab + ids[r]], mx) << "greedy row " << r;
    }
  }
}

// The cross-shard step over NCCL with one rank (what a one-GPU machine can run of it): its buffers from the
// arena, the gather of strided rows into strided full rows, and the call path of combine (with one rank the
// join keeps every candidate: the join itself is JoinCandidates' and the two-GPU test's); a host
// communicator is refused.
TEST(Sampling, CrossShardStepOnOneRank) {
  KIMIRT_REQUIRE_GPU();
  const int64_t rows = 5, vocab = 3000, ld = vocab + 7, ld_full = vocab + 13;
  auto comm = NcclComm::create(nccl_new_id(), 1, 0, 0);
  const VocabShard shard{0, vocab, vocab};
  DeviceArena arena(CommCrossShard::arena_bytes(1, shard, rows), 0);
  CommCrossShard cross(*comm, shard, rows, arena);
  const std::vector<float> logits = test::random_vec(rows * ld, 5);
  DeviceBuffer dl = upload(logits), full = test::poisoned(rows * ld_full * 4);
  cross.gather_logits(nullptr, dl.as<float>(), ld, rows, full.as<float>(), ld_full);
  const auto got = download<float>(full.data(), rows * ld_full);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < vocab; ++v) ASSERT_EQ(got[r * ld_full + v], logits[r * ld + v]) << r << ", " << v;
  const std::vector<float> scores = {1.0f, -2.0f, 3.0f, 0.5f, -INFINITY};
  const std::vector<int32_t> ids = {4, 3, 2, 1, 0};
  DeviceBuffer ds = upload(scores), di = upload(ids);
  cross.combine(nullptr, ds.as<float>(), di.as<int32_t>(), rows);
  EXPECT_EQ(download<float>(ds.data(), rows), scores);
  EXPECT_EQ(download<int32_t>(di.data(), rows), ids);
  EXPECT_THROW(cross.combine(nullptr, ds.as<float>(), di.as<int32_t>(), rows + 1), Error) << "more rows than planned";
  SingleComm host;
  DeviceArena other(CommCrossShard::arena_bytes(1, shard, rows), 0);
  EXPECT_THROW(CommCrossShard(host, shard, rows, other), Error) << "a host communicator";
  // An arena with room for the candidates but not the logits: refused, and the arena is as it was (no
  // allocation left owned by nobody).
  DeviceArena small(CommCrossShard::arena_bytes(1, shard, rows) - 1024, 0);
  const uint64_t before = small.persistent_used(), mark = small.persistent_mark();
  EXPECT_THROW(CommCrossShard(*comm, shard, rows, small), Error);
  EXPECT_EQ(small.persistent_used(), before);
  EXPECT_EQ(small.persistent_mark(), mark);
  EXPECT_THROW(CommCrossShard(*comm, shard, int64_t{1} << 40, other), Error) << "sizes past 64 bits";
}

// Two ranks on two GPUs, each with half of the vocabulary, sample a batch of greedy, temperature-only and
// filtered rows over NCCL (CommCrossShard): both get exactly the ids one GPU samples from the whole
// vocabulary's logits (the shards' logits, concatenated), first joined per shard, then gathered. Padded row
// strides (the shard's rows are packed before the gather, the full rows land strided), room for more rows
// than the call has, and a stream of its own.
TEST(Sampling, TwoRanksSampleAsOneGpu) {
  KIMIRT_REQUIRE_TWO_GPUS();
  const int64_t m = 24, hidden = 256, total = 40960, size = total / 2;
  std::vector<SamplingParams> ps(m);
  for (int64_t i = 0; i < m; ++i) {
    ps[i].seed = 1000 + i, ps[i].step = i;
    ps[i].temperature = i % 6 == 0 ? 0.0f : 0.6f + 0.1f * (i % 5);
  }
  // The filtered batch: top-k (below the shard size, or between it and the vocabulary), top-p, min-p.
  const auto params = [&](bool filtered) {
    std::vector<SamplingParams> p = ps;
    if (filtered) {
      for (int64_t i = 0; i < m; ++i) {
        p[i].top_k = i % 3 == 1 ? (i % 2 ? 40 : size + 100) : 0;
        p[i].top_p = i % 3 == 2 ? 0.8f : 1.0f;
        p[i].min_p = i % 4 == 3 ? 0.05f : 0.0f;
      }
    }
    EXPECT_EQ(any_uses_filters(p, total), filtered);
    return p;
  };
  const std::vector<float> x = test::random_vec(m * hidden, 91, -1, 1), w = test::random_vec(total * hidden, 92, -1, 1);
  const NcclId id = nccl_new_id();
  std::vector<float> shard_logits[2];
  std::vector<int32_t> got[2][2];  // [rank][unfiltered, filtered]
  test::on_two_ranks([&](int r) {
    KIMIRT_CUDA_CHECK(cudaSetDevice(r));
    auto comm = NcclComm::create(id, 2, r, r);
    const VocabShard shard{r * size, size, total};
    // The cross step's buffers in an arena of the size it asks for: enough (it would throw), and not more than
    // the one alignment unit it adds for a region that does not start on one (this fresh arena's does).
    DeviceArena arena(CommCrossShard::arena_bytes(2, shard, m + 3), 0);
    CommCrossShard cross(*comm, shard, m + 3, arena);
    EXPECT_GE(arena.persistent_used() + kArenaAlignment, arena.persistent_capacity());
    EXPECT_EQ(arena.device(), r);
    Stream stream;
    const int64_t ld = size + 16, ld_full = total + 32;
    DeviceBuffer ws(8 << 20), sws(8 << 20);
    GemmLt lt(ws.data(), ws.size());
    Linear linear(lt, sws.data(), sws.size(), query_device(r).sm_count);
    std::vector<float> x_r = x, w_shard(w.begin() + r * size * hidden, w.begin() + (r + 1) * size * hidden);
    DeviceBuffer dx = upload(test::to_bf16(x_r)), dw = upload(test::to_bf16(w_shard)), logits(m * ld * 4), ids(m * 4),
                 scores(m * 4), full(m * ld_full * 4);
    for (const bool filtered : {false, true}) {
      const std::vector<SamplingParams> p = params(filtered);
      DeviceBuffer dp = upload(p);
      poison(ids.data(), ids.size(), nullptr);
      lm_head_sample(linear, stream, dx.as<__nv_bfloat16>(), m, hidden, dw.as<__nv_bfloat16>(), shard,
                     logits.as<float>(), ld, dp.as<SamplingParams>(), ids.as<int32_t>(),
                     {.cross = &cross,
                      .scratch_scores = scores.as<float>(),
                      .any_filtered = any_uses_filters(p, total),
                      .full_logits = full.as<float>(),
                      .ld_full = ld_full});
      stream.synchronize();
      got[r][filtered] = download<int32_t>(ids.data(), m);
    }
    const auto padded = download<float>(logits.data(), m * ld);
    for (int64_t i = 0; i < m; ++i)
      shard_logits[r].insert(shard_logits[r].end(), padded.begin() + i * ld, padded.begin() + i * ld + size);
  });
  KIMIRT_CUDA_CHECK(cudaSetDevice(0));
  std::vector<float> whole(m * total);
  for (int64_t i = 0; i < m; ++i)
    for (int r = 0; r < 2; ++r)
      std::copy_n(shard_logits[r].begin() + i * size, size, whole.begin() + i * total + r * size);
  DeviceBuffer dwhole = upload(whole), ids(m * 4);
  for (const bool filtered : {false, true}) {
    DeviceBuffer dp = upload(params(filtered));
    poison(ids.data(), ids.size(), nullptr);
    sample(nullptr, dwhole.as<float>(), total, m, total, 0, dp.as<SamplingParams>(), ids.as<int32_t>());
    const auto want = download<int32_t>(ids.data(), m);
    EXPECT_EQ(got[0][filtered], want) << (filtered ? "filtered" : "greedy and temperature-only") << ", rank 0";
    EXPECT_EQ(got[1][filtered], want) << (filtered ? "filtered" : "greedy and temperature-only") << ", rank 1";
  }
}

}  // namespace
}  // namespace kimirt::cuda
