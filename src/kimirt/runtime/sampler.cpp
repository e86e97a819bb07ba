#include "kimirt/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kimirt/base/error.h"
#include "kimirt/cpu/lm_head.h"

namespace kimirt::runtime {

void SamplingParams::validate() const {
  KIMIRT_CHECK(std::isfinite(temperature) && temperature >= 0.0f, "temperature must be >= 0, got {}", temperature);
  KIMIRT_CHECK(top_k >= 0, "top_k must be >= 0, got {}", top_k);
  KIMIRT_CHECK(top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got {}", top_p);
  KIMIRT_CHECK(min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got {}", min_p);
  KIMIRT_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f, "repetition_penalty must be > 0, got {}",
               repetition_penalty);
  KIMIRT_CHECK(std::isfinite(presence_penalty) && presence_penalty >= -2.0f && presence_penalty <= 2.0f,
               "presence_penalty must be in [-2, 2], got {}", presence_penalty);
  KIMIRT_CHECK(std::isfinite(frequency_penalty) && frequency_penalty >= -2.0f && frequency_penalty <= 2.0f,
               "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  KIMIRT_CHECK(max_tokens >= 0, "max_tokens must be >= 0, got {}", max_tokens);
}

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt_ids)
    : params_(params), rng_(params.seed) {
  params_.validate();
  for (int32_t id : prompt_ids) mark_seen(id);
}

void Sampler::mark_seen(int32_t token) {
  if (params_.repetition_penalty == 1.0f || token < 0) return;
  const auto i = static_cast<size_t>(token);
  if (i >= seen_mask_.size()) seen_mask_.resize(i + 1, 0);
  if (!seen_mask_[i]) {
    seen_mask_[i] = 1;
    seen_.push_back(token);
  }
}

void Sampler::record(int32_t token) {
  generated_counts_[token]++;
  mark_seen(token);
}

void Sampler::apply_penalties(std::span<float> logits) const {
  const auto vocab = static_cast<int32_t>(logits.size());
  if (params_.repetition_penalty != 1.0f) {
    for (int32_t id : seen_) {
      if (id >= vocab) continue;
      float& l = logits[static_cast<size_t>(id)];
      l = l > 0.0f ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [id, count] : generated_counts_) {
      if (id < 0 || id >= vocab) continue;
      logits[static_cast<size_t>(id)] -=
          params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
    }
  }
}

int32_t Sampler::sample(std::span<float> logits) {
  KIMIRT_CHECK(!logits.empty(), "sampling from an empty logits row");
  apply_penalties(logits);
  int32_t token;
  if (params_.greedy()) {
    // Ties go to the lowest id: the rule the golden greedy ids follow.
    token = cpu::argmax(logits.data(), static_cast<int64_t>(logits.size()));
  } else {
    // NaN is never drawn (greedy skips it too) and would break the sort's ordering: it counts as -inf.
    for (float& l : logits) {
      if (std::isnan(l)) l = -std::numeric_limits<float>::infinity();
    }
    // Candidates sorted by logit (ties: lower id first, so the order is deterministic).
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    auto by_logit = [&](int32_t a, int32_t b) {
      const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
      return la > lb || (la == lb && a < b);
    };
    size_t keep = order.size();
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
      keep = static_cast<size_t>(params_.top_k);
      std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(keep), order.end(), by_logit);
    } else {
      std::sort(order.begin(), order.end(), by_logit);
    }
    order.resize(keep);
    // Softmax at temperature over the kept candidates, in double for a stable cumulative sum. An infinite
    // top logit takes all the mass (shared by the infinite ones); a row with nothing finite or above -inf
    // gives the first candidate, the lowest id, as greedy does.
    const double max_logit = logits[static_cast<size_t>(order[0])];
    if (std::isinf(max_logit) && max_logit < 0) {
      record(order[0]);
      return order[0];
    }
    std::vector<double> probs(keep);
    double total = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      const double l = logits[static_cast<size_t>(order[i])];
      probs[i] = std::isinf(max_logit) ? (l == max_logit ? 1.0 : 0.0)
                                       : std::exp((l - max_logit) / static_cast<double>(params_.temperature));
      total += probs[i];
    }
    for (auto& p : probs) p /= total;
    if (params_.top_p < 1.0f) {
      double cumulative = 0.0;
      size_t n = 0;
      while (n < keep) {
        cumulative += probs[n++];
        if (cumulative >= static_cast<double>(params_.top_p)) break;
      }
      keep = n;
    }
    if (params_.min_p > 0.0f) {
      const double threshold = static_cast<double>(params_.min_p) * probs[0];
      size_t n = 1;
      while (n < keep && probs[n] >= threshold) ++n;
      keep = n;
    }
    double kept_total = 0.0;
    for (size_t i = 0; i < keep; ++i) kept_total += probs[i];
    // One uniform draw per step from the request's generator: reproducible for a given seed.
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * kept_total;
    double cumulative = 0.0;
    token = order[keep - 1];
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i];
      if (u < cumulative) {
        token = order[i];
        break;
      }
    }
  }
  record(token);
  return token;
}

}  // namespace kimirt::runtime
