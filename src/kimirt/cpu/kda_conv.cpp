#include "kimirt/cpu/kda_conv.h"

#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/cpu/activation.h"

namespace kimirt::cpu {

void short_conv_silu(const float* x, const float* w, float* state, int64_t tokens, int64_t channels, int64_t width,
                     float* y) {
  KIMIRT_CHECK(width >= 1, "short_conv_kernel_size must be at least 1, got {}", width);
  const int64_t hist = width - 1;
  // The window of one channel: its W-1 carried inputs followed by this call's inputs.
  std::vector<float> z(static_cast<size_t>(hist + tokens));
  for (int64_t c = 0; c < channels; ++c) {
    const float* wc = w + c * width;
    float* sc = state + c * hist;
    for (int64_t i = 0; i < hist; ++i) z[i] = sc[i];
    for (int64_t t = 0; t < tokens; ++t) z[hist + t] = x[t * channels + c];
    for (int64_t t = 0; t < tokens; ++t) {
      // z[t + j] is input position t - (W-1) + j relative to the current token t.
      float acc = 0.0f;
      for (int64_t j = 0; j < width; ++j) acc += wc[j] * z[t + j];
      y[t * channels + c] = silu(acc);
    }
    for (int64_t i = 0; i < hist; ++i) sc[i] = z[tokens + i];
  }
}

}  // namespace kimirt::cpu
