// Scale values a quantized checkpoint must not hold. A block scale that decodes to NaN or infinity makes its
// whole group or block (32 MXFP4 weights, 16 NVFP4, 128 x 128 FP8) NaN or infinite, and the model's output
// with them, without any error; a negative one (no quantizer writes one: a scale is a magnitude) flips the
// block's signs, as silently. The loader refuses both, and counts E8M0's code 0x00, which readers decode
// differently (spec checkpoints-and-loading §5.2: "a load-time anomaly worth counting").
#pragma once

#include <cstdint>
#include <limits>

#include "kimirt/quant/weight_format.h"
#include "kimirt/tensor/dtype.h"

namespace kimirt::quant {

// How a component's values are scales: kNone for data and per-tensor scalars (checked where they are read).
enum class ScaleCode : uint8_t { kNone, kE8M0, kE4M3, kFloat };

// The encoding of component `c` of a `format` weight stored as `dtype` (component_accepts holds).
ScaleCode block_scale_code(WeightFormat format, const Component& c, DType dtype);

// The largest float block scale whose weights all stay finite: E4M3 weights reach 448, and 448 times anything
// larger overflows float. E8M0 codes 0xFD and 0xFE (2^126, 2^127) overflow the same way for E2M1 values of 4 and
// 6 (0xFD) or 2 and up (0xFE).
inline constexpr float kMaxFloatBlockScale = std::numeric_limits<float>::max() / 448.0f;
inline constexpr uint8_t kMaxE8m0BlockScale = 0xFC;
// NVFP4's per-tensor scale, the same way: the group scales (E4M3, up to 448) times E2M1 values (up to 6) times
// ModelOpt's weight_scale_2 must stay within float, as must the group scales over compressed-tensors'
// weight_global_scale. Past these bounds the quantizer's amax (weight_scale_2 = amax / 2688, global = 2688 / amax)
// would itself be past float.
inline constexpr float kMaxNvfp4GlobalMultiplier = std::numeric_limits<float>::max() / (448.0f * 6.0f);
inline constexpr float kMinNvfp4GlobalDivisor = (448.0f * 6.0f) / std::numeric_limits<float>::max();

struct ScaleCodeCount {
  // E8M0 0xFF (NaN) and codes above kMaxE8m0BlockScale; E4M3 0x7F / 0xFF and negative codes; a float that is not
  // finite, is negative, or is above kMaxFloatBlockScale.
  uint64_t invalid = 0;
  uint64_t first_invalid = 0;  // the index of the first, among the values counted (valid when invalid > 0)
  // E8M0 0x00: 2^-127 for some readers, zero for others (the two disagree; real K3 checkpoints have none).
  uint64_t e8m0_zero = 0;
};

// Counts the `count` scale values at `data` (stored as `dtype`, encoded as `code`).
ScaleCodeCount count_scale_codes(ScaleCode code, DType dtype, const uint8_t* data, uint64_t count);

}  // namespace kimirt::quant
