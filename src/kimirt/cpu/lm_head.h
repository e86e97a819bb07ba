// LM head (logits = x · W_lmᵀ, no bias, no soft-capping; §3.8) and greedy argmax.
#pragma once

#include <cstdint>

namespace kimirt::cpu {

// logits[tokens, vocab] = x[tokens, hidden] · w[vocab, hidden]ᵀ.
void lm_head(const float* x, const float* w, int64_t tokens, int64_t hidden, int64_t vocab, float* logits);

// Index of the largest of n values; the lowest index among equal maxima. NaN never wins (all-NaN → 0).
int32_t argmax(const float* values, int64_t n);

// argmax of each row of logits[rows, n] into ids[rows].
void argmax_rows(const float* logits, int64_t rows, int64_t n, int32_t* ids);

}  // namespace kimirt::cpu
