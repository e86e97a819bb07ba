#include "kimirt/cpu/activation.h"

#include "kimirt/base/error.h"

namespace kimirt::cpu {

void validate(const GluActivation& act) {
  if (act.kind != GluActivation::Kind::kSitu) return;
  KIMIRT_CHECK(std::isfinite(act.beta) && act.beta > 0.0f, "activation_situ_beta must be finite and positive, got {}",
               act.beta);
  if (act.linear_beta) {
    KIMIRT_CHECK(std::isfinite(*act.linear_beta) && *act.linear_beta > 0.0f,
                 "activation_situ_linear_beta must be finite and positive, got {}", *act.linear_beta);
  }
}

float glu(const GluActivation& act, float gate, float up) {
  if (act.kind == GluActivation::Kind::kSilu) return silu(gate) * up;
  const float g = act.beta * std::tanh(gate / act.beta) * sigmoid(gate);
  const float u = act.linear_beta ? *act.linear_beta * std::tanh(up / *act.linear_beta) : up;
  return g * u;
}

void glu(const GluActivation& act, const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = glu(act, gate[i], up[i]);
}

}  // namespace kimirt::cpu
