#include "kimirt/runtime/cpu_moe.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "kimirt/cpu/matmul.h"
#include "kimirt/cpu/mlp.h"
#include "kimirt/cpu/norm.h"
#include "kimirt/cpu/router.h"

namespace kimirt::runtime {

void local_routed_experts(const CpuLocalDims& dims, const CpuLayerWeights& w, const float* z, int64_t tokens,
                          const int32_t* expert_ids, const float* weights, float* y) {
  const int64_t width = dims.expert_width, k = dims.router.top_k;
  const auto num_local = static_cast<int64_t>(w.experts.size());
  std::vector<std::vector<std::pair<int64_t, float>>> assigned(w.experts.size());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = expert_ids[t * k + j] - w.first_expert;
      if (e >= 0 && e < num_local) assigned[static_cast<size_t>(e)].emplace_back(t, weights[t * k + j]);
    }
  }
  std::fill(y, y + tokens * width, 0.0f);
  std::vector<float> rows;
  const cpu::GatedMlpDims mlp{width, dims.expert_intermediate};
  for (int64_t e = 0; e < num_local; ++e) {
    const auto& mine = assigned[static_cast<size_t>(e)];
    if (mine.empty()) continue;
    const auto n = static_cast<int64_t>(mine.size());
    rows.resize(static_cast<size_t>(n * width));
    for (int64_t r = 0; r < n; ++r) std::copy_n(z + mine[r].first * width, width, rows.data() + r * width);
    cpu::gated_mlp(mlp, w.experts[static_cast<size_t>(e)], dims.act, rows.data(), n, rows.data());
    for (int64_t r = 0; r < n; ++r) {
      float* dst = y + mine[r].first * width;
      const float* src = rows.data() + r * width;
      const float wgt = mine[r].second;
      for (int64_t i = 0; i < width; ++i) dst[i] += wgt * src[i];
    }
  }
}

void cpu_moe_block(const CpuLocalDims& dims, const model::ModelConfig& config, const CpuLayerWeights& w, const float* x,
                   int64_t tokens, Comm& comm, float* out, RouteTrace* trace) {
  const int64_t H = config.hidden_size, k = dims.router.top_k, width = dims.expert_width;
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  std::vector<float> weights(ids.size());
  cpu::route(dims.router, w.router, x, tokens, H, ids.data(), weights.data());
  if (trace) {
    trace->top_k = k;
    trace->expert_ids = ids;
    trace->weights = weights;
  }
  const bool shared = dims.shared_intermediate > 0;
  const cpu::GatedMlpDims shared_dims{H, dims.shared_intermediate};

  if (!config.latent_moe()) {
    // Both branches are in model space: summed locally, then one reduction.
    local_routed_experts(dims, w, x, tokens, ids.data(), weights.data(), out);
    if (shared) {
      std::vector<float> s(static_cast<size_t>(tokens * H));
      cpu::gated_mlp(shared_dims, w.shared, dims.act, x, tokens, s.data());
      for (size_t i = 0; i < s.size(); ++i) out[i] += s[i];
    }
    comm.all_reduce_sum(out, static_cast<size_t>(tokens * H), DType::kF32);
    return;
  }

  // [shared partial (tokens × H) | routed latent partial (tokens × width)] in one buffer, one all-reduce.
  const int64_t shared_size = shared ? tokens * H : 0;
  std::vector<float> partial(static_cast<size_t>(shared_size + tokens * width));
  float* routed = partial.data() + shared_size;
  std::vector<float> z(static_cast<size_t>(tokens * width));
  cpu::matmul(x, w.latent_down, z.data(), tokens, width, H);
  local_routed_experts(dims, w, z.data(), tokens, ids.data(), weights.data(), routed);
  if (shared) cpu::gated_mlp(shared_dims, w.shared, dims.act, x, tokens, partial.data());
  comm.all_reduce_sum(partial.data(), partial.size(), DType::kF32);

  // The latent is complete only now: normalize, project up, add the shared result.
  if (config.latent_moe_use_norm) cpu::rms_norm(routed, w.latent_norm, routed, tokens, width, dims.rms_norm_eps);
  cpu::matmul(routed, w.latent_up, out, tokens, H, width);
  if (shared) {
    for (int64_t i = 0; i < tokens * H; ++i) out[i] += partial[static_cast<size_t>(i)];
  }
}

}  // namespace kimirt::runtime
