#include "kimirt/cpu/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <vector>

#include "kimirt/base/error.h"
#include "test_util.h"

namespace kimirt::cpu {
namespace {

using testing::random_normal;
using testing::random_uniform;
using testing::ref_matmul;
using testing::ref_rms_norm;
using testing::ref_sigmoid;
using testing::rel_error;

struct Expert {
  std::vector<float> gate, up, down;
};

Expert make_expert(int64_t width, int64_t inter, uint32_t seed) {
  return {random_normal(inter * width, seed, 0.3f), random_normal(inter * width, seed + 1, 0.3f),
          random_normal(width * inter, seed + 2, 0.3f)};
}

// Independent double-precision expert: down(situ or silu(gate(x), up(x))).
std::vector<double> ref_expert(const Expert& e, const std::vector<double>& x, int64_t width, int64_t inter, bool situ) {
  const auto g = ref_matmul(x, e.gate, 1, inter, width);
  const auto u = ref_matmul(x, e.up, 1, inter, width);
  std::vector<double> a(static_cast<size_t>(inter));
  for (int64_t i = 0; i < inter; ++i) {
    a[i] = situ ? 4.0 * std::tanh(g[i] / 4.0) * ref_sigmoid(g[i]) * 25.0 * std::tanh(u[i] / 25.0)
                : g[i] * ref_sigmoid(g[i]) * u[i];
  }
  return ref_matmul(a, e.down, 1, width, inter);
}

struct MoeCase {
  int64_t hidden = 32, latent = 0, inter = 16, shared_inter = 24, experts = 8, top_k = 3, tokens = 11;
  bool situ = false;
};

void check_moe(const MoeCase& c) {
  const int64_t width = c.latent > 0 ? c.latent : c.hidden;
  const auto x = random_normal(c.tokens * c.hidden, 21);
  const auto gate = random_normal(c.experts * c.hidden, 22, 0.5f);
  const auto bias = random_normal(c.experts, 23, 0.1f);
  std::vector<Expert> experts;
  for (int64_t e = 0; e < c.experts; ++e) experts.push_back(make_expert(width, c.inter, 100 + 3 * e));
  const Expert shared = make_expert(c.hidden, c.shared_inter, 50);
  const auto down = random_normal(c.latent * c.hidden, 60, 0.3f);
  const auto norm = random_uniform(c.latent, 61, 0.8f, 1.2f);
  const auto up = random_normal(c.hidden * c.latent, 62, 0.3f);

  // Reference, token by token.
  std::vector<double> ref(static_cast<size_t>(c.tokens * c.hidden));
  std::vector<std::vector<int32_t>> ref_ids(c.tokens);
  for (int64_t t = 0; t < c.tokens; ++t) {
    const std::vector<double> xt(x.begin() + t * c.hidden, x.begin() + (t + 1) * c.hidden);
    auto s = ref_matmul(xt, gate, 1, c.experts, c.hidden);
    for (auto& v : s) v = ref_sigmoid(v);
    std::vector<int32_t> order(c.experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[a] + bias[a] > s[b] + bias[b]; });
    order.resize(c.top_k);
    double sum = 0.0;
    for (int32_t e : order) sum += s[e];
    const std::vector<double> z = c.latent > 0 ? ref_matmul(xt, down, 1, c.latent, c.hidden) : xt;
    std::vector<double> y(static_cast<size_t>(width), 0.0);
    for (int32_t e : order) {
      const auto ye = ref_expert(experts[e], z, width, c.inter, c.situ);
      for (int64_t i = 0; i < width; ++i) y[i] += s[e] / sum * ye[i];
    }
    std::vector<double> routed = y;
    if (c.latent > 0) routed = ref_matmul(ref_rms_norm(y, norm, 1, c.latent, 1e-5), up, 1, c.hidden, c.latent);
    const auto sh = ref_expert(shared, xt, c.hidden, c.shared_inter, c.situ);
    for (int64_t i = 0; i < c.hidden; ++i) ref[t * c.hidden + i] = routed[i] + sh[i];
    std::sort(order.begin(), order.end());
    ref_ids[t] = order;
  }

  std::vector<GatedMlpWeights> ew;
  for (const auto& e : experts) ew.push_back({e.gate.data(), e.up.data(), e.down.data()});
  MoeWeights w;
  w.router = {gate.data(), bias.data()};
  w.experts = ew;
  w.shared = {shared.gate.data(), shared.up.data(), shared.down.data()};
  if (c.latent > 0) {
    w.latent_down = down.data();
    w.latent_norm = norm.data();
    w.latent_up = up.data();
  }
  RouterConfig rc;
  rc.num_experts = c.experts;
  rc.top_k = c.top_k;
  const MoeDims dims{c.hidden, c.latent, c.inter, c.shared_inter, 1e-5f};
  std::vector<float> out(ref.size());
  std::vector<int32_t> ids(static_cast<size_t>(c.tokens * c.top_k));
  std::vector<float> weights(ids.size());
  const auto act = c.situ ? GluActivation::situ(4.0f, 25.0f) : GluActivation::silu();
  moe_forward(dims, rc, w, act, x.data(), c.tokens, out.data(), {ids.data(), weights.data()});

  for (int64_t t = 0; t < c.tokens; ++t) {
    std::vector<int32_t> got(ids.begin() + t * c.top_k, ids.begin() + (t + 1) * c.top_k);
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, ref_ids[t]) << "token " << t;
    EXPECT_NEAR(std::accumulate(weights.begin() + t * c.top_k, weights.begin() + (t + 1) * c.top_k, 0.0), 1.0, 1e-6);
  }
  EXPECT_LE(rel_error(out, ref), 2e-6);
}

TEST(CpuMoe, ModelSpaceSiluExpertsWithSharedExpert) { check_moe({}); }

TEST(CpuMoe, LatentSpaceSituExpertsWithNormAndSharedExperts) {
  MoeCase c;
  c.latent = 20;
  c.situ = true;
  c.experts = 16;
  c.top_k = 4;
  check_moe(c);
}

TEST(CpuMoe, RoutedExpertsWeightEachExpertOutput) {
  // Two experts of width 1 and intermediate 1 with identity-like weights: expert_e(z) = w2·silu(w1 z)·(w3 z).
  const std::vector<float> e0_gate = {1}, e0_up = {1}, e0_down = {1};
  const std::vector<float> e1_gate = {1}, e1_up = {2}, e1_down = {-1};
  const std::vector<GatedMlpWeights> ex = {{e0_gate.data(), e0_up.data(), e0_down.data()},
                                           {e1_gate.data(), e1_up.data(), e1_down.data()}};
  const std::vector<float> z = {2.0f};
  const std::vector<int32_t> ids = {1, 0};
  const std::vector<float> w = {0.25f, 0.75f};
  float y = 0.0f;
  routed_experts({ex, 0, 2}, 1, 1, GluActivation::silu(), z.data(), 1, ids.data(), w.data(), 2, &y);
  const double s = testing::ref_silu(2.0);
  EXPECT_NEAR(y, 0.75 * s * 2.0 + 0.25 * (-(s * 4.0)), 1e-6);
}

// Under expert parallelism each rank runs its shard of the experts on the choices that name them; the ranks'
// sums add up to the unsharded result, and run_expert_rows hands every row of the shard to its expert once.
TEST(CpuMoe, ExpertShardsAddUpToAllExperts) {
  const int64_t width = 16, inter = 8, tokens = 6, top_k = 3, num = 6;
  std::vector<Expert> experts;
  std::vector<GatedMlpWeights> w;
  for (int64_t e = 0; e < num; ++e) experts.push_back(make_expert(width, inter, 300 + 3 * static_cast<uint32_t>(e)));
  for (const auto& e : experts) w.push_back({e.gate.data(), e.up.data(), e.down.data()});
  const auto z = random_normal(tokens * width, 320);
  const std::vector<int32_t> ids = {0, 3, 5, 1, 2, 4, 5, 0, 2, 3, 4, 1, 2, 5, 0, 1, 3, 4};
  const auto weights = random_uniform(tokens * top_k, 321, 0.1f, 1.0f);
  const auto act = GluActivation::silu();
  std::vector<float> all(static_cast<size_t>(tokens * width)), sum(all.size(), 0.0f), part(all.size());
  routed_experts({w, 0, num}, width, inter, act, z.data(), tokens, ids.data(), weights.data(), top_k, all.data());
  for (int32_t first : {0, 2, 4}) {
    const ExpertShard shard{std::span<const GatedMlpWeights>(w).subspan(static_cast<size_t>(first), 2), first, num};
    routed_experts(shard, width, inter, act, z.data(), tokens, ids.data(), weights.data(), top_k, part.data());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    std::vector<int64_t> seen;
    const int64_t ran = run_expert_rows(
        shard, {width, inter}, act, ids.data(), tokens * top_k,
        [&](int64_t p) { return z.data() + (p / top_k) * width; }, [&](int64_t p, const float*) { seen.push_back(p); });
    std::vector<int64_t> mine;  // the shard's rows, grouped by expert, rows in order
    for (int32_t e = first; e < first + 2; ++e) {
      for (int64_t p = 0; p < tokens * top_k; ++p) {
        if (ids[static_cast<size_t>(p)] == e) mine.push_back(p);
      }
    }
    EXPECT_EQ(seen, mine) << "shard from " << first;
    EXPECT_EQ(ran, static_cast<int64_t>(mine.size()));
  }
  EXPECT_LE(rel_error(sum, all), 1e-6);
}

TEST(CpuMoe, BadExpertIdIsAnError) {
  const std::vector<float> one = {1};
  const std::vector<GatedMlpWeights> ex = {{one.data(), one.data(), one.data()}};
  const std::vector<int32_t> ids = {3};
  const std::vector<float> w = {1.0f};
  float z = 1.0f, y = 0.0f;
  EXPECT_THROW(routed_experts({ex, 0, 1}, 1, 1, GluActivation::silu(), &z, 1, ids.data(), w.data(), 1, &y), Error);
}

TEST(CpuMoe, ExpertCountMustMatchRouter) {
  const std::vector<float> one = {1};
  const std::vector<GatedMlpWeights> ex = {{one.data(), one.data(), one.data()}};
  MoeWeights w;
  w.router = {one.data(), nullptr};
  w.experts = ex;
  RouterConfig rc;
  rc.num_experts = 2;
  rc.top_k = 1;
  float x = 1.0f, out = 0.0f;
  EXPECT_THROW(moe_forward({1, 0, 1, 0}, rc, w, GluActivation::silu(), &x, 1, &out), Error);
}

}  // namespace
}  // namespace kimirt::cpu
