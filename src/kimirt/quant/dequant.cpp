#include "kimirt/quant/dequant.h"

#include <cmath>

#include <vector>

#include "kimirt/quant/scale_codes.h"
#include "kimirt/tensor/float_convert.h"

namespace kimirt::quant {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

float scalar_f32(const TensorView& v) {
  float out = 0;
  convert_to_f32(v.dtype(), v.data(), &out, 1);
  return out;
}

// f32 copy of a small float tensor (scales may be stored BF16/F16/F32).
std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  convert_to_f32(v.dtype(), v.data(), out.data(), v.numel());
  return out;
}

}  // namespace

void dequantize_mxfp4(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols, float* out) {
  const int64_t packed_cols = cols / 2;
  const int64_t groups = ceil_div(cols, 32);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* p = packed + r * packed_cols;
    const uint8_t* s = scales + r * groups;
    float* o = out + r * cols;
    for (int64_t c = 0; c < cols; c += 2) {
      const float scale = e8m0_to_f32(s[c / 32]);
      const uint8_t byte = p[c / 2];
      o[c] = e2m1_to_f32(byte & 0xfu) * scale;
      o[c + 1] = e2m1_to_f32(byte >> 4) * scale;
    }
  }
}

void dequantize_fp8_block(const uint8_t* weight, const float* scales, int64_t rows, int64_t cols, int64_t block_rows,
                          int64_t block_cols, float* out) {
  const int64_t scale_cols = ceil_div(cols, block_cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scales + (r / block_rows) * scale_cols;
    for (int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] = e4m3_to_f32(weight[r * cols + c]) * s[c / block_cols];
    }
  }
}

void dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales, float global_scale, GlobalScale mode, int64_t rows,
                      int64_t cols, float* out) {
  const int64_t packed_cols = cols / 2;
  const int64_t groups = ceil_div(cols, 16);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* p = packed + r * packed_cols;
    const uint8_t* s = scales + r * groups;
    float* o = out + r * cols;
    for (int64_t c = 0; c < cols; c += 2) {
      const float group = e4m3_to_f32(s[c / 16]);
      const float scale = mode == GlobalScale::kMultiply ? group * global_scale : group / global_scale;
      const uint8_t byte = p[c / 2];
      o[c] = e2m1_to_f32(byte & 0xfu) * scale;
      o[c + 1] = e2m1_to_f32(byte >> 4) * scale;
    }
  }
}

Tensor dequantize(WeightFormat format, std::span<const TensorView> parts, std::span<const int64_t> logical,
                  std::string_view name) {
  const auto comps = format_components(format);
  // Two values per byte: an odd count would step the rows by the wrong length and write past the last one.
  KIMIRT_CHECK(!is_packed_fp4_data(format) || (logical.size() == 2 && logical[1] % 2 == 0),
               "{}: a packed FP4 weight needs 2 dims and an even column count, got {}", name,
               shape_str(Shape(logical.begin(), logical.end())));
  KIMIRT_CHECK(parts.size() == comps.size(), "{}: {} parts given for a {} weight of {} components", name, parts.size(),
               format_name(format), comps.size());
  for (size_t i = 0; i < comps.size(); ++i) {
    // Absent is the default view (no shape, no data); a present part with no elements has a shape and may have
    // no data, and is checked as any other.
    if (parts[i].data() == nullptr && parts[i].shape().empty()) {
      KIMIRT_CHECK(!comps[i].required, "{}: the {} of a {} weight is missing", name, comps[i].suffix,
                   format_name(format));
      continue;
    }
    KIMIRT_CHECK(component_accepts(format, comps[i], parts[i].dtype()), "{}: {} is {}, not valid for a {} weight", name,
                 comps[i].suffix, dtype_name(parts[i].dtype()), format_name(format));
    const Shape want = component_shape(format, comps[i], logical);
    KIMIRT_CHECK(parts[i].shape() == want && parts[i].is_contiguous(), "{}: {} has shape {}, expected {}", name,
                 comps[i].suffix, shape_str(parts[i].shape()), shape_str(want));
  }
  Tensor out(DType::kF32, Shape(logical.begin(), logical.end()));
  float* o = out.data_as<float>();
  if (format == WeightFormat::kFloat) {
    convert_to_f32(parts[0].dtype(), parts[0].data(), o, out.numel());
    return out;
  }
  const int64_t rows = logical[0];
  const int64_t cols = logical[1];
  const auto* data = parts[0].data_as<const uint8_t>();
  switch (format) {
    case WeightFormat::kMxfp4:
      dequantize_mxfp4(data, parts[1].data_as<const uint8_t>(), rows, cols, o);
      break;
    case WeightFormat::kFp8BlockScaleInv:
    case WeightFormat::kFp8BlockScale: {
      const auto scales = to_f32(parts[1]);
      dequantize_fp8_block(data, scales.data(), rows, cols, comps[1].tile_rows, comps[1].tile_cols, o);
      break;
    }
    case WeightFormat::kNvfp4ModelOpt: {
      // One number scales the whole tensor: a NaN or infinite one would make every weight so, a negative one flip
      // every sign, and one past kMaxNvfp4GlobalMultiplier make the large ones infinite, silently (zero is an
      // all-zero weight's).
      const float global = scalar_f32(parts[2]);
      KIMIRT_CHECK(std::isfinite(global) && global >= 0.0f && global <= kMaxNvfp4GlobalMultiplier,
                   "{}: weight_scale_2 is {}, not a number in [0, {}] (above it, E4M3 group scales times E2M1 values "
                   "overflow float)",
                   name, global, kMaxNvfp4GlobalMultiplier);
      dequantize_nvfp4(data, parts[1].data_as<const uint8_t>(), global, GlobalScale::kMultiply, rows, cols, o);
      break;
    }
    case WeightFormat::kNvfp4CompressedTensors: {
      const float global = scalar_f32(parts[2]);
      KIMIRT_CHECK(std::isfinite(global) && global >= kMinNvfp4GlobalDivisor,
                   "{}: weight_global_scale is {}, not a finite number >= {} (below it, E4M3 group scales times E2M1 "
                   "values over it overflow float)",
                   name, global, kMinNvfp4GlobalDivisor);
      dequantize_nvfp4(data, parts[1].data_as<const uint8_t>(), global, GlobalScale::kDivide, rows, cols, o);
      break;
    }
    case WeightFormat::kFloat:
      break;
  }
  return out;
}

}  // namespace kimirt::quant
