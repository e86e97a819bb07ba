#include "kimirt/cpu/embedding.h"

#include <algorithm>

#include "kimirt/base/error.h"

namespace kimirt::cpu {

void embedding_gather(const float* table, int64_t vocab, int64_t hidden, std::span<const int32_t> ids, float* out) {
  KIMIRT_CHECK(vocab > 0 && hidden > 0, "embedding: vocab {} and hidden {} must be positive", vocab, hidden);
  if (ids.empty()) return;
  KIMIRT_CHECK(table && out, "embedding: null table or output");
  // Validate every id before writing anything, so a bad request leaves `out` untouched.
  for (size_t t = 0; t < ids.size(); ++t) {
    KIMIRT_CHECK(ids[t] >= 0 && ids[t] < vocab, "token id {} at position {} is outside the vocabulary [0, {})", ids[t],
                 t, vocab);
  }
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* row = table + static_cast<int64_t>(ids[t]) * hidden;
    std::copy(row, row + hidden, out + static_cast<int64_t>(t) * hidden);
  }
}

}  // namespace kimirt::cpu
