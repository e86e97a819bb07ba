// KDA short causal depthwise convolution + SiLU (§3.4 step 2), with the carried conv state.
#pragma once

#include <cstdint>

namespace kimirt::cpu {

// For channel c and token t:  y[t, c] = SiLU( Σ_{j=0..W-1} w[c, j] · z_{t-(W-1)+j}[c] ),
// where z is the input sequence x preceded by the W-1 inputs held in `state` (zeros at sequence start).
// Tap W-1 multiplies the current token (PyTorch conv1d cross-correlation with left padding W-1).
//   x, y   [tokens, channels]; y must not overlap x
//   w      [channels, W]  (the checkpoint's [channels, 1, W])
//   state  [channels, W-1], oldest input first: read, then replaced by the last W-1 PRE-conv inputs.
void short_conv_silu(const float* x, const float* w, float* state, int64_t tokens, int64_t channels, int64_t width,
                     float* y);

}  // namespace kimirt::cpu
