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

// With u = 0 every mix is the plain average of its candidates, so the bookkeeping of §2 can be followed
// by hand. Block size 2, four layers, one token, hidden 1; embedding e, mixer outputs a_ℓ, FFN outputs f_ℓ.
TEST(CpuAttnRes, StreamTakesSnapshotsAtBlockBoundariesAfterTheMix) {
  const std::vector<float> zero = {0.0f};
  const AttnResWeights w{zero.data(), zero.data()};
  AttnResStream s(1, 1, 2, 1e-5f);
  const float e = 1.0f, a[4] = {10, 20, 30, 40}, f[4] = {100, 200, 300, 400};
  float h = 0.0f;
  s.begin(&e);

  s.mixer_input(0, w, &h);  // bank empty: h = P = e; then B = [e], P = ∅
  EXPECT_EQ(h, 1.0f);
  EXPECT_EQ(s.num_snapshots(), 1);
  s.add_mixer_output(&a[0]);  // P = a0 = 10
  s.ffn_input(w, &h);         // avg(e, 10)
  EXPECT_FLOAT_EQ(h, 5.5f);
  s.add_ffn_output(&f[0]);  // P = 110

  s.mixer_input(1, w, &h);  // avg(e, 110); not a boundary
  EXPECT_FLOAT_EQ(h, 55.5f);
  EXPECT_EQ(s.num_snapshots(), 1);
  s.add_mixer_output(&a[1]);  // P = 130
  s.ffn_input(w, &h);
  EXPECT_FLOAT_EQ(h, 65.5f);
  s.add_ffn_output(&f[1]);  // P = 330

  s.mixer_input(2, w, &h);  // avg(e, 330) computed BEFORE the snapshot; then B = [e, 330], P = ∅
  EXPECT_FLOAT_EQ(h, 165.5f);
  EXPECT_EQ(s.num_snapshots(), 2);
  EXPECT_TRUE(s.prefix().empty());
  s.add_mixer_output(&a[2]);  // P restarts from a2 = 30
  s.ffn_input(w, &h);         // avg(e, 330, 30)
  EXPECT_FLOAT_EQ(h, 361.0f / 3.0f);
  s.add_ffn_output(&f[2]);  // P = 330

  s.mixer_input(3, w, &h);  // avg(e, 330, 330)
  EXPECT_FLOAT_EQ(h, 661.0f / 3.0f);
  s.add_mixer_output(&a[3]);  // P = 370
  s.ffn_input(w, &h);
  EXPECT_FLOAT_EQ(h, 701.0f / 3.0f);
  s.add_ffn_output(&f[3]);  // P = 770

  s.final_output(w, &h);  // avg(e, 330, 770)
  EXPECT_FLOAT_EQ(h, 1101.0f / 3.0f);
}

TEST(CpuAttnRes, BadBlockSizeIsAnError) { EXPECT_THROW(AttnResStream(1, 4, 0, 1e-5f), Error); }

}  // namespace
}  // namespace kimirt::cpu
