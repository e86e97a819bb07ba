#include "kimirt/cpu/router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/cpu/activation.h"
#include "kimirt/cpu/matmul.h"

namespace kimirt::cpu {
namespace {

bool grouping_applies(const RouterConfig& cfg) {
  return cfg.num_expert_group > 1 && cfg.num_expert_group > cfg.topk_group;
}

// Indices of the `k` largest values, largest first; ties go to the lower index. NaN ranks below every number
// (as the GPU router's order_key puts it): a plain `>` would make the order inconsistent, which is undefined
// for the sort and would pick or drop a NaN expert at random.
std::vector<int32_t> top_indices(std::span<const float> values, int64_t k) {
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    const bool nan_a = std::isnan(values[a]), nan_b = std::isnan(values[b]);
    if (nan_a || nan_b) return nan_a == nan_b ? a < b : nan_b;
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  order.resize(static_cast<size_t>(k));
  return order;
}

// select_experts on a validated config.
void select_validated(const RouterConfig& cfg, const float* scores, const float* correction_bias, int32_t* expert_ids,
                      float* weights) {
  const auto n = static_cast<size_t>(cfg.num_experts);
  std::vector<float> biased(n);
  for (size_t e = 0; e < n; ++e) biased[e] = scores[e] + (correction_bias ? correction_bias[e] : 0.0f);

  if (grouping_applies(cfg)) {
    const int64_t per_group = cfg.num_experts / cfg.num_expert_group;
    std::vector<float> group_score(static_cast<size_t>(cfg.num_expert_group));
    for (int64_t g = 0; g < cfg.num_expert_group; ++g) {
      const auto best2 = top_indices(std::span<const float>(biased).subspan(g * per_group, per_group), 2);
      group_score[g] = biased[g * per_group + best2[0]] + biased[g * per_group + best2[1]];
    }
    std::vector<bool> keep(static_cast<size_t>(cfg.num_expert_group), false);
    for (int32_t g : top_indices(group_score, cfg.topk_group)) keep[g] = true;
    for (size_t e = 0; e < n; ++e) {
      if (!keep[e / per_group]) biased[e] = -std::numeric_limits<float>::infinity();
    }
  }

  const auto chosen = top_indices(biased, cfg.top_k);
  float sum = 0.0f;
  for (int64_t j = 0; j < cfg.top_k; ++j) {
    expert_ids[j] = chosen[j];
    weights[j] = scores[chosen[j]];  // the raw sigmoid: the bias only selects
    sum += weights[j];
  }
  const bool renorm = cfg.renormalize && cfg.top_k > 1;
  for (int64_t j = 0; j < cfg.top_k; ++j) {
    if (renorm) weights[j] /= sum + 1e-20f;
    weights[j] *= cfg.routed_scaling_factor;
  }
}

}  // namespace

void validate(const RouterConfig& cfg) {
  KIMIRT_CHECK(cfg.num_experts > 0, "num_experts must be positive, got {}", cfg.num_experts);
  KIMIRT_CHECK(cfg.top_k > 0 && cfg.top_k <= cfg.num_experts,
               "num_experts_per_token must be in [1, num_experts = {}], got {}", cfg.num_experts, cfg.top_k);
  KIMIRT_CHECK(cfg.num_expert_group > 0 && cfg.num_experts % cfg.num_expert_group == 0,
               "num_expert_group ({}) must be positive and divide num_experts ({})", cfg.num_expert_group,
               cfg.num_experts);
  KIMIRT_CHECK(cfg.topk_group > 0 && cfg.topk_group <= cfg.num_expert_group,
               "topk_group must be in [1, num_expert_group = {}], got {}", cfg.num_expert_group, cfg.topk_group);
  if (grouping_applies(cfg)) {
    const int64_t per_group = cfg.num_experts / cfg.num_expert_group;
    // A group is scored by its two best experts.
    KIMIRT_CHECK(per_group >= 2, "grouped routing needs at least 2 experts per group, got {} ({} experts / {} groups)",
                 per_group, cfg.num_experts, cfg.num_expert_group);
    KIMIRT_CHECK(cfg.topk_group * per_group >= cfg.top_k,
                 "topk_group ({}) x experts per group ({}) is less than num_experts_per_token ({})", cfg.topk_group,
                 per_group, cfg.top_k);
  }
  KIMIRT_CHECK(std::isfinite(cfg.routed_scaling_factor) && cfg.routed_scaling_factor > 0.0f,
               "routed_scaling_factor must be finite and positive, got {}", cfg.routed_scaling_factor);
}

void select_experts(const RouterConfig& cfg, const float* scores, const float* correction_bias, int32_t* expert_ids,
                    float* weights) {
  validate(cfg);  // a top_k past num_experts would sort past the end
  select_validated(cfg, scores, correction_bias, expert_ids, weights);
}

void route(const RouterConfig& cfg, const RouterWeights& w, const float* x, int64_t tokens, int64_t hidden,
           int32_t* expert_ids, float* weights) {
  validate(cfg);
  KIMIRT_CHECK(w.gate != nullptr, "router: gate.weight is required");
  std::vector<float> scores(static_cast<size_t>(tokens * cfg.num_experts));
  matmul(x, w.gate, scores.data(), tokens, cfg.num_experts, hidden);
  for (float& s : scores) s = sigmoid(s);
  for (int64_t t = 0; t < tokens; ++t) {
    select_validated(cfg, scores.data() + t * cfg.num_experts, w.correction_bias, expert_ids + t * cfg.top_k,
                     weights + t * cfg.top_k);
  }
}

}  // namespace kimirt::cpu
