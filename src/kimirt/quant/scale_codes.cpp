#include "kimirt/quant/scale_codes.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kimirt/tensor/float_convert.h"

namespace kimirt::quant {

ScaleCode block_scale_code(WeightFormat format, const Component& c, DType dtype) {
  if (c.role != ComponentRole::kBlockScale) return ScaleCode::kNone;
  if (format == WeightFormat::kMxfp4) return ScaleCode::kE8M0;
  if (dtype == DType::kF8E4M3) return ScaleCode::kE4M3;
  return ScaleCode::kFloat;
}

ScaleCodeCount count_scale_codes(ScaleCode code, DType dtype, const uint8_t* data, uint64_t count) {
  ScaleCodeCount out;
  const auto invalid_at = [&out](uint64_t i) {
    if (out.invalid++ == 0) out.first_invalid = i;
  };
  switch (code) {
    case ScaleCode::kNone:
      break;
    case ScaleCode::kE8M0:
      for (uint64_t i = 0; i < count; ++i) {
        if (data[i] > kMaxE8m0BlockScale) invalid_at(i);
        out.e8m0_zero += data[i] == 0x00;
      }
      break;
    case ScaleCode::kE4M3:
      for (uint64_t i = 0; i < count; ++i) {
        // NaN (either sign), or negative: the sign bit on anything but zero (0x80, -0, scales a block of zeros).
        if ((data[i] & 0x7F) == 0x7F || (data[i] & 0x80 && data[i] != 0x80)) invalid_at(i);
      }
      break;
    case ScaleCode::kFloat: {
      if (dtype == DType::kF64) {
        // Every reader takes the scales as f32 (dequantize, the GPU GEMMs): a double past the float range is as
        // invalid as infinity, since it becomes infinity there.
        for (uint64_t i = 0; i < count; ++i) {
          double d;
          std::memcpy(&d, data + 8 * i, sizeof d);
          if (!std::isfinite(static_cast<float>(d)) || d < 0.0 || d > kMaxFloatBlockScale) invalid_at(i);
        }
        break;
      }
      // Through f32 in chunks (the FP8 block scales are a few per 16 K weights: never a long loop).
      const uint64_t width = static_cast<uint64_t>(dtype_bits(dtype) / 8);
      float buf[256];
      for (uint64_t i = 0; i < count; i += 256) {
        const uint64_t n = std::min<uint64_t>(256, count - i);
        convert_to_f32(dtype, data + i * width, buf, static_cast<int64_t>(n));
        for (uint64_t j = 0; j < n; ++j) {
          if (!std::isfinite(buf[j]) || buf[j] < 0.0f || buf[j] > kMaxFloatBlockScale) invalid_at(i + j);
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace kimirt::quant
