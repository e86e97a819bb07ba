// The 16-bit floats' rounding from f32 as plain functions, for the communicators' sums: f32_to_bf16 and
// f32_to_f16 have overloads and default arguments, so they cannot be template arguments as they are.
#pragma once

#include <cstdint>

#include "kimirt/tensor/float_convert.h"

namespace kimirt {

inline uint16_t round_to_bf16(float f) { return f32_to_bf16(f); }
inline uint16_t round_to_f16(float f) { return f32_to_f16(f); }

}  // namespace kimirt
