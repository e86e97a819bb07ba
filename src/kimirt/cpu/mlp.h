// Gated MLP: out = down( act(x · gateᵀ, x · upᵀ) ). The dense layer-0 FFN, the shared experts and every
// routed expert are this block (§3.6, §3.7); they differ only in width and activation.
#pragma once

#include <cstdint>

#include "kimirt/cpu/activation.h"

namespace kimirt::cpu {

struct GatedMlpWeights {
  const float* gate_proj = nullptr;  // [intermediate, in]   (gate_proj / w1)
  const float* up_proj = nullptr;    // [intermediate, in]   (up_proj / w3)
  const float* down_proj = nullptr;  // [in, intermediate]   (down_proj / w2)
};

struct GatedMlpDims {
  int64_t in = 0;            // model width (or the latent width for K3 routed experts)
  int64_t intermediate = 0;  // FFN width
};

// out[rows, in] = MLP(x[rows, in]). out may equal x.
void gated_mlp(const GatedMlpDims& dims, const GatedMlpWeights& w, const GluActivation& act, const float* x,
               int64_t rows, float* out);

}  // namespace kimirt::cpu
