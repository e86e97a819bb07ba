#include "kimirt/cpu/attn_res.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kimirt/base/error.h"
#include "test_util.h"

namespace kimirt::cpu {
namespace {

using testing::random_normal;
using testing::random_uniform;
using testing::rel_error;

TEST(CpuAttnRes, HandCheckedMix) {
  // hidden 2, one token. v0 = [2, 0] → k0 = [√2, 0]; v1 = [0, −1] → k1 = [0, −√2] (eps 0).
  // u = norm ⊙ proj = [1, 1] ⊙ [ln 3 / √2, 0] → s = [ln 3, 0] → α = [3/4, 1/4].
  const std::vector<float> v0 = {2, 0}, v1 = {0, -1};
  const std::vector<float> norm = {1, 1}, proj = {static_cast<float>(std::log(3.0) / std::sqrt(2.0)), 0};
  const float* cands[] = {v0.data(), v1.data()};
  std::vector<float> out(2);
  attn_res_mix(cands, 1, 2, {norm.data(), proj.data()}, 0.0f, out.data());
  EXPECT_NEAR(out[0], 0.75 * 2, 1e-6);
  EXPECT_NEAR(out[1], 0.25 * -1, 1e-6);
}

TEST(CpuAttnRes, MixMatchesDoubleReference) {
  const int64_t T = 4, H = 64, n = 5;
  std::vector<std::vector<float>> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(random_normal(T * H, 40 + static_cast<uint32_t>(i), 1.0f + i));
  const auto norm = random_uniform(H, 50, 0.8f, 1.2f);
  const auto proj = random_normal(H, 51, 0.3f);
  std::vector<double> ref(static_cast<size_t>(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(n);
    double mx = -1e300;
    for (int64_t i = 0; i < n; ++i) {
      double sq = 0.0;
      for (int64_t j = 0; j < H; ++j) sq += static_cast<double>(v[i][t * H + j]) * v[i][t * H + j];
      const double r = 1.0 / std::sqrt(sq / H + 1e-5);
      double dot = 0.0;
      for (int64_t j = 0; j < H; ++j) dot += v[i][t * H + j] * r * norm[j] * static_cast<double>(proj[j]);
      s[i] = dot;
      mx = std::max(mx, dot);
    }
    double sum = 0.0;
    for (auto& x : s) sum += (x = std::exp(x - mx));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < H; ++j) ref[t * H + j] += s[i] / sum * v[i][t * H + j];
    }
  }
  std::vector<const float*> cands;
  for (const auto& x : v) cands.push_back(x.data());
  std::vector<float> out(ref.size());
  attn_res_mix(cands, T, H, {norm.data(), proj.data()}, 1e-5f, out.data());
  EXPECT_LE(rel_error(out, ref), 1e-6);
}

TEST(CpuAttnRes, NoCandidatesOrNoWeightsIsAnError) {
  const std::vector<float> v = {1, 2}, w = {1, 1};
  std::vector<float> out(2);
  EXPECT_THROW(attn_res_mix({}, 1, 2, {w.data(), w.data()}, 1e-5f, out.data()), Error);
  const float* one[] = {v.data()};
  EXPECT_THROW(attn_res_mix(one, 1, 2, {w.data(), nullptr}, 1e-5f, out.data()), Error);
}

}  // namespace
}  // namespace kimirt::cpu
