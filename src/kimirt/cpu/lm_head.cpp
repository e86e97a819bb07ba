#include "kimirt/cpu/lm_head.h"

#include <cmath>

#include "kimirt/base/error.h"
#include "kimirt/cpu/matmul.h"

namespace kimirt::cpu {

void lm_head(const float* x, const float* w, int64_t tokens, int64_t hidden, int64_t vocab, float* logits) {
  KIMIRT_CHECK(tokens >= 0 && hidden > 0 && vocab > 0, "LM head: tokens {}, hidden {}, vocab {}", tokens, hidden,
               vocab);
  if (tokens == 0) return;
  KIMIRT_CHECK(x && w && logits, "LM head: null hidden states, weight or logits");
  matmul(x, w, logits, tokens, vocab, hidden);
}

int32_t argmax(const float* values, int64_t n) {
  KIMIRT_CHECK(n > 0, "argmax of an empty row");
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(values[i])) continue;
    if (best < 0 || values[i] > values[best]) best = i;
  }
  return static_cast<int32_t>(best < 0 ? 0 : best);
}

void argmax_rows(const float* logits, int64_t rows, int64_t n, int32_t* ids) {
  for (int64_t r = 0; r < rows; ++r) ids[r] = argmax(logits + r * n, n);
}

}  // namespace kimirt::cpu
