// Scalar activations and the gated linear units of the FFNs (§3.6), fp32.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

namespace kimirt::cpu {

// σ(x) without overflow for large |x| (exp only of a non-positive argument).
inline float sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.0f + e);
}

inline float silu(float x) { return x * sigmoid(x); }

// log(1 + eˣ) as PyTorch's F.softplus (beta 1, threshold 20: linear above it).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// Which gated unit an FFN uses: Kimi Linear SiLU-GLU, Kimi K3 SiTU-GLU.
//   SiLU: out = silu(g) · u
//   SiTU: out = β₁·tanh(g/β₁)·σ(g) · β₂·tanh(u/β₂), or · u when linear_beta (β₂) is absent.
struct GluActivation {
  enum class Kind { kSilu, kSitu };
  Kind kind = Kind::kSilu;
  float beta = 1.0f;                 // β₁ = activation_situ_beta (SiTU only)
  std::optional<float> linear_beta;  // β₂ = activation_situ_linear_beta (SiTU only)

  static GluActivation silu() { return {}; }
  static GluActivation situ(float beta, std::optional<float> linear_beta) { return {Kind::kSitu, beta, linear_beta}; }
};

// Throws when a SiTU β is not finite and positive (names the config field).
void validate(const GluActivation& act);

// One element of the gated unit.
float glu(const GluActivation& act, float gate, float up);

// out[i] = glu(gate[i], up[i]) for n elements; gate and up are separate arrays (the checkpoint stores
// gate_proj/w1 and up_proj/w3 as separate tensors). out may equal gate or up.
void glu(const GluActivation& act, const float* gate, const float* up, float* out, int64_t n);

}  // namespace kimirt::cpu
