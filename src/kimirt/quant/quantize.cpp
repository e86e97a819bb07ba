#include "kimirt/quant/quantize.h"

#include <algorithm>
#include <cmath>

#include "kimirt/tensor/float_convert.h"

namespace kimirt::quant {
namespace {

constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;

float block_amax(std::span<const float> v, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  float amax = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(v[static_cast<size_t>(r * cols + c)]));
  }
  return amax;
}

// Packs E2M1 codes of x / scale, two per byte, even element in the low nibble.
void pack_fp4_row(const float* x, int64_t c0, int64_t c1, float scale, uint8_t* packed_row) {
  for (int64_t c = c0; c < c1; c += 2) {
    const uint8_t lo = scale == 0.0f ? 0 : f32_to_e2m1(x[c] / scale);
    const uint8_t hi = scale == 0.0f ? 0 : f32_to_e2m1(x[c + 1] / scale);
    packed_row[c / 2] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

QuantizedWeight quantize_mxfp4(std::span<const float> v, const Shape& shape) {
  const int64_t rows = shape[0], cols = shape[1];
  const auto comps = format_components(WeightFormat::kMxfp4);
  QuantizedWeight q{WeightFormat::kMxfp4, shape, {}};
  q.parts.emplace_back(DType::kU8, component_shape(q.format, comps[0], shape));
  q.parts.emplace_back(DType::kU8, component_shape(q.format, comps[1], shape));
  auto* packed = q.parts[0].data_as<uint8_t>();
  auto* scales = q.parts[1].data_as<uint8_t>();
  const int64_t groups = q.parts[1].dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * 32, c1 = std::min(cols, c0 + 32);
      const float amax = block_amax(v, cols, r, r + 1, c0, c1);
      // floor(log2(amax)) - 2 puts amax / scale in [4, 8): the top of E2M1's range, saturating above 6.
      const int exponent = amax == 0.0f ? 0 : std::ilogb(amax) - 2;
      const int code = std::clamp(exponent + 127, 0, 254);
      scales[r * groups + g] = static_cast<uint8_t>(code);
      pack_fp4_row(v.data() + r * cols, c0, c1, e8m0_to_f32(static_cast<uint8_t>(code)), packed + r * (cols / 2));
    }
  }
  return q;
}

QuantizedWeight quantize_fp8_block(WeightFormat format, std::span<const float> v, const Shape& shape) {
  const int64_t rows = shape[0], cols = shape[1];
  const auto comps = format_components(format);
  const int64_t br = comps[1].tile_rows, bc = comps[1].tile_cols;
  QuantizedWeight q{format, shape, {}};
  q.parts.emplace_back(DType::kF8E4M3, component_shape(format, comps[0], shape));
  q.parts.emplace_back(DType::kF32, component_shape(format, comps[1], shape));
  q.parts.emplace_back();  // input_scale: activations are quantized dynamically
  auto* w = q.parts[0].data_as<uint8_t>();
  auto* s = q.parts[1].data_as<float>();
  const int64_t sr = q.parts[1].dim(0), sc = q.parts[1].dim(1);
  for (int64_t i = 0; i < sr; ++i) {
    for (int64_t j = 0; j < sc; ++j) {
      const int64_t r0 = i * br, r1 = std::min(rows, r0 + br), c0 = j * bc, c1 = std::min(cols, c0 + bc);
      const float amax = block_amax(v, cols, r0, r1, c0, c1);
      const float scale = amax == 0.0f ? 1.0f : amax / kE4M3Max;
      s[i * sc + j] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          w[r * cols + c] = f32_to_e4m3(v[static_cast<size_t>(r * cols + c)] / scale, Overflow::kSaturate);
        }
      }
    }
  }
  return q;
}

QuantizedWeight quantize_nvfp4(WeightFormat format, std::span<const float> v, const Shape& shape) {
  const int64_t rows = shape[0], cols = shape[1];
  const auto comps = format_components(format);
  const bool modelopt = format == WeightFormat::kNvfp4ModelOpt;
  QuantizedWeight q{format, shape, {}};
  q.parts.emplace_back(DType::kU8, component_shape(format, comps[0], shape));
  q.parts.emplace_back(DType::kF8E4M3, component_shape(format, comps[1], shape));
  q.parts.emplace_back(DType::kF32, Shape{});
  q.parts.emplace_back();  // input scale: not produced (weight-only)
  const float amax = block_amax(v, cols, 0, rows, 0, cols);
  // ModelOpt stores the multiplier amax / (6 * 448); compressed-tensors stores its inverse as a divisor.
  const float global = amax == 0.0f ? 1.0f : (modelopt ? amax / (kE2M1Max * kE4M3Max) : kE2M1Max * kE4M3Max / amax);
  // Below about 8e-36 the divisor passes the float range: dequantize would refuse what this wrote.
  KIMIRT_CHECK(std::isfinite(global) && global > 0.0f,
               "quantize: the {} global scale of a weight whose largest magnitude is {} is not a positive float "
               "({})",
               format_name(format), amax, global);
  *q.parts[2].data_as<float>() = global;
  auto* packed = q.parts[0].data_as<uint8_t>();
  auto* scales = q.parts[1].data_as<uint8_t>();
  const int64_t groups = q.parts[1].dim(1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * 16, c1 = std::min(cols, c0 + 16);
      const float group_amax = block_amax(v, cols, r, r + 1, c0, c1);
      const float want = modelopt ? group_amax / kE2M1Max / global : group_amax / kE2M1Max * global;
      const uint8_t code = f32_to_e4m3(want, Overflow::kSaturate);
      scales[r * groups + g] = code;
      const float group_scale = e4m3_to_f32(code);
      const float effective = modelopt ? group_scale * global : group_scale / global;
      pack_fp4_row(v.data() + r * cols, c0, c1, effective, packed + r * (cols / 2));
    }
  }
  return q;
}

}  // namespace

std::vector<TensorView> QuantizedWeight::views() const {
  std::vector<TensorView> out;
  for (const auto& p : parts) out.push_back(p.empty() ? TensorView() : p.view());
  return out;
}

QuantizedWeight quantize(WeightFormat format, std::span<const float> values, const Shape& shape, DType float_dtype) {
  const int64_t n = shape_numel(shape);
  KIMIRT_CHECK(static_cast<int64_t>(values.size()) == n, "quantize: {} values for shape {}", values.size(),
               shape_str(shape));
  for (int64_t i = 0; i < n; ++i) {
    KIMIRT_CHECK(std::isfinite(values[static_cast<size_t>(i)]), "quantize: value {} (flat index {}) is not finite",
                 values[static_cast<size_t>(i)], i);
  }
  if (format == WeightFormat::kFloat) {
    KIMIRT_CHECK(component_accepts(format, format_components(format)[0], float_dtype),
                 "quantize: {} is not a plain float dtype", dtype_name(float_dtype));
    QuantizedWeight q{format, shape, {}};
    q.parts.emplace_back(float_dtype, shape);
    convert_from_f32(float_dtype, values.data(), q.parts[0].data(), n);
    // A finite value past the dtype's range (70000 in F16) would be stored as infinity.
    std::vector<float> back(static_cast<size_t>(n));
    convert_to_f32(float_dtype, q.parts[0].data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      KIMIRT_CHECK(std::isfinite(back[static_cast<size_t>(i)]),
                   "quantize: value {} (flat index {}) is past the {} range", values[static_cast<size_t>(i)], i,
                   dtype_name(float_dtype));
    }
    return q;
  }
  KIMIRT_CHECK(shape.size() == 2, "quantize: a {} weight must be 2-D, got {}", format_name(format), shape_str(shape));
  switch (format) {
    case WeightFormat::kMxfp4:
    case WeightFormat::kNvfp4ModelOpt:
    case WeightFormat::kNvfp4CompressedTensors:
      KIMIRT_CHECK(shape[1] % 2 == 0, "quantize: a packed FP4 weight needs an even column count, got {}",
                   shape_str(shape));
      return format == WeightFormat::kMxfp4 ? quantize_mxfp4(values, shape) : quantize_nvfp4(format, values, shape);
    case WeightFormat::kFp8BlockScaleInv:
    case WeightFormat::kFp8BlockScale:
      return quantize_fp8_block(format, values, shape);
    case WeightFormat::kFloat:
      break;
  }
  fail("quantize: unknown format");
}

}  // namespace kimirt::quant
