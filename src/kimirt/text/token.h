// The token id type used across the text layer (and by the runtime when it hands ids to text::).
#pragma once

#include <cstdint>

namespace kimirt::text {

// Kimi vocabularies have 163,840 ids; int32 matches the I32/I64 id tensors of the runtime without casts.
using TokenId = std::int32_t;

}  // namespace kimirt::text
