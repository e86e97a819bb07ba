// Token embedding: a plain row gather from the [vocab, hidden] table (no scaling, §3.1).
#pragma once

#include <cstdint>
#include <span>

namespace kimirt::cpu {

// out[t, :] = table[ids[t], :]. An id outside [0, vocab) is an Error naming the position and the id.
void embedding_gather(const float* table, int64_t vocab, int64_t hidden, std::span<const int32_t> ids, float* out);

}  // namespace kimirt::cpu
