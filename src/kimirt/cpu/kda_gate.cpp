#include "kimirt/cpu/kda_gate.h"

#include <cmath>

#include "kimirt/cpu/activation.h"

namespace kimirt::cpu {

void kda_forget_gate(const float* f, const float* a_log, const float* dt_bias, std::optional<float> lower_bound,
                     int64_t tokens, int64_t heads, int64_t head_dim, float* g) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float a = std::exp(a_log[h]);
      const int64_t base = (t * heads + h) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) {
        const float z = f[base + d] + dt_bias[h * head_dim + d];
        g[base + d] = lower_bound ? *lower_bound * sigmoid(a * z) : -a * softplus(z);
      }
    }
  }
}

void kda_beta(const float* b, int64_t n, float* beta) {
  for (int64_t i = 0; i < n; ++i) beta[i] = sigmoid(b[i]);
}

}  // namespace kimirt::cpu
