#include "kimirt/cpu/moe.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/cpu/matmul.h"
#include "kimirt/cpu/norm.h"

namespace kimirt::cpu {

int64_t run_expert_rows(const ExpertShard& shard, const GatedMlpDims& dims, const GluActivation& act,
                        const int32_t* ids, int64_t rows, const std::function<const float*(int64_t)>& input,
                        const std::function<void(int64_t, const float*)>& emit) {
  const auto num_local = static_cast<int64_t>(shard.weights.size());
  // Counting sort of the shard's rows by expert, keeping row order within an expert.
  std::vector<int64_t> starts(static_cast<size_t>(num_local + 1), 0);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t e = ids[i] - shard.first;
    if (e >= 0 && e < num_local) ++starts[static_cast<size_t>(e + 1)];
  }
  for (int64_t e = 0; e < num_local; ++e) starts[static_cast<size_t>(e + 1)] += starts[static_cast<size_t>(e)];
  std::vector<int64_t> order(static_cast<size_t>(starts.back()));
  std::vector<int64_t> next(starts.begin(), starts.end() - 1);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t e = ids[i] - shard.first;
    if (e >= 0 && e < num_local) order[static_cast<size_t>(next[static_cast<size_t>(e)]++)] = i;
  }
  const int64_t width = dims.in;
  std::vector<float> batch;
  for (int64_t e = 0; e < num_local; ++e) {
    const int64_t b = starts[static_cast<size_t>(e)], n = starts[static_cast<size_t>(e + 1)] - b;
    if (n == 0) continue;
    batch.resize(static_cast<size_t>(n * width));
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(input(order[static_cast<size_t>(b + r)]), width, batch.data() + r * width);
    }
    gated_mlp(dims, shard.weights[static_cast<size_t>(e)], act, batch.data(), n, batch.data());
    for (int64_t r = 0; r < n; ++r) emit(order[static_cast<size_t>(b + r)], batch.data() + r * width);
  }
  return starts.back();
}

void routed_experts(const ExpertShard& shard, int64_t width, int64_t intermediate, const GluActivation& act,
                    const float* z, int64_t tokens, const int32_t* expert_ids, const float* weights, int64_t top_k,
                    float* y) {
  // A bad id is an error before any work is done.
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t e = expert_ids[t * top_k + j];
      KIMIRT_CHECK(e >= 0 && e < shard.total, "routed experts: expert id {} (token {}, slot {}) outside [0, {})", e, t,
                   j, shard.total);
    }
  }
  std::fill(y, y + tokens * width, 0.0f);
  // One row per (token, slot) choice.
  run_expert_rows(
      shard, {width, intermediate}, act, expert_ids, tokens * top_k, [&](int64_t p) { return z + (p / top_k) * width; },
      [&](int64_t p, const float* out) {
        float* dst = y + (p / top_k) * width;
        const float w = weights[p];
        for (int64_t i = 0; i < width; ++i) dst[i] += w * out[i];
      });
}

void moe_forward(const MoeDims& dims, const RouterConfig& router, const MoeWeights& w, const GluActivation& act,
                 const float* x, int64_t tokens, float* out, MoeRoutes routes) {
  validate(router);
  validate(act);
  KIMIRT_CHECK(dims.hidden > 0 && dims.expert_intermediate > 0,
               "MoE: hidden_size ({}) and moe_intermediate_size ({}) must be positive", dims.hidden,
               dims.expert_intermediate);
  KIMIRT_CHECK(dims.latent >= 0 && dims.shared_intermediate >= 0,
               "MoE: routed_expert_hidden_size ({}) and the shared width ({}) must not be negative", dims.latent,
               dims.shared_intermediate);
  KIMIRT_CHECK(static_cast<int64_t>(w.experts.size()) == router.num_experts,
               "MoE: {} expert weight sets for {} experts", w.experts.size(), router.num_experts);
  const bool latent = dims.latent > 0;
  KIMIRT_CHECK(!latent || (w.latent_down && w.latent_up),
               "MoE: routed_expert_down_proj and routed_expert_up_proj are required with a latent width");
  if (tokens == 0) return;

  const auto k = router.top_k;
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  std::vector<float> weights(ids.size());
  route(router, w.router, x, tokens, dims.hidden, ids.data(), weights.data());
  if (routes.expert_ids) std::copy(ids.begin(), ids.end(), routes.expert_ids);
  if (routes.weights) std::copy(weights.begin(), weights.end(), routes.weights);

  const int64_t width = latent ? dims.latent : dims.hidden;
  std::vector<float> z;
  const float* expert_in = x;
  if (latent) {
    z.resize(static_cast<size_t>(tokens * width));
    matmul(x, w.latent_down, z.data(), tokens, width, dims.hidden);
    expert_in = z.data();
  }
  std::vector<float> y(static_cast<size_t>(tokens * width));
  routed_experts({w.experts, 0, router.num_experts}, width, dims.expert_intermediate, act, expert_in, tokens,
                 ids.data(), weights.data(), k, y.data());
  if (latent) {
    // The combined latent is normalized only once every expert's share is in (the TP/EP rule of §3.7).
    if (w.latent_norm) rms_norm(y.data(), w.latent_norm, y.data(), tokens, width, dims.latent_norm_eps);
    matmul(y.data(), w.latent_up, out, tokens, dims.hidden, width);
  } else {
    std::copy(y.begin(), y.end(), out);
  }

  if (dims.shared_intermediate > 0) {
    std::vector<float> shared(static_cast<size_t>(tokens * dims.hidden));
    gated_mlp({dims.hidden, dims.shared_intermediate}, w.shared, act, x, tokens, shared.data());
    for (size_t i = 0; i < shared.size(); ++i) out[i] += shared[i];
  }
}

}  // namespace kimirt::cpu
