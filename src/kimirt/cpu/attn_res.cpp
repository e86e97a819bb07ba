#include "kimirt/cpu/attn_res.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/cpu/norm.h"

namespace kimirt::cpu {

void attn_res_mix(std::span<const float* const> candidates, int64_t tokens, int64_t hidden, const AttnResWeights& w,
                  float eps, float* out) {
  KIMIRT_CHECK(!candidates.empty(), "AttnRes: no candidates to mix");
  KIMIRT_CHECK(w.norm && w.proj, "AttnRes: res_norm.weight and res_proj.weight are required");
  check_norm_eps("AttnRes", eps);
  const auto n = candidates.size();
  std::vector<float> u(static_cast<size_t>(hidden));
  for (int64_t i = 0; i < hidden; ++i) u[i] = w.norm[i] * w.proj[i];
  std::vector<float> alpha(n);
  std::vector<float> mixed(static_cast<size_t>(hidden));
  for (int64_t t = 0; t < tokens; ++t) {
    for (size_t c = 0; c < n; ++c) {
      const float* v = candidates[c] + t * hidden;
      double sq = 0.0, dot = 0.0;
      for (int64_t i = 0; i < hidden; ++i) {
        sq += static_cast<double>(v[i]) * v[i];
        dot += static_cast<double>(v[i]) * u[i];
      }
      // ⟨v · r, u⟩ = r · ⟨v, u⟩ with r = (mean(v²) + eps)^-½.
      alpha[c] = static_cast<float>(dot / std::sqrt(sq / static_cast<double>(hidden) + eps));
    }
    const float mx = *std::max_element(alpha.begin(), alpha.end());
    float sum = 0.0f;
    for (float& a : alpha) {
      a = std::exp(a - mx);
      sum += a;
    }
    std::fill(mixed.begin(), mixed.end(), 0.0f);
    for (size_t c = 0; c < n; ++c) {
      const float a = alpha[c] / sum;
      const float* v = candidates[c] + t * hidden;
      for (int64_t i = 0; i < hidden; ++i) mixed[i] += a * v[i];
    }
    std::copy(mixed.begin(), mixed.end(), out + t * hidden);
  }
}

}  // namespace kimirt::cpu
