#include "kimirt/quant/scale_codes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kimirt/tensor/float_convert.h"

namespace kimirt::quant {
namespace {

const Component& component(WeightFormat f, std::string_view suffix) {
  return format_components(f)[static_cast<size_t>(component_index(f, suffix))];
}

TEST(ScaleCodes, EachFormatsBlockScaleAndNothingElse) {
  EXPECT_EQ(block_scale_code(WeightFormat::kMxfp4, component(WeightFormat::kMxfp4, "weight_scale"), DType::kU8),
            ScaleCode::kE8M0);
  EXPECT_EQ(block_scale_code(WeightFormat::kMxfp4, component(WeightFormat::kMxfp4, "weight_scale"), DType::kF8E8M0),
            ScaleCode::kE8M0);
  EXPECT_EQ(block_scale_code(WeightFormat::kMxfp4, component(WeightFormat::kMxfp4, "weight_packed"), DType::kU8),
            ScaleCode::kNone);
  const WeightFormat nv = WeightFormat::kNvfp4ModelOpt;
  EXPECT_EQ(block_scale_code(nv, component(nv, "weight_scale"), DType::kF8E4M3), ScaleCode::kE4M3);
  EXPECT_EQ(block_scale_code(nv, component(nv, "weight_scale_2"), DType::kF32), ScaleCode::kNone);
  const WeightFormat fp8 = WeightFormat::kFp8BlockScaleInv;
  EXPECT_EQ(block_scale_code(fp8, component(fp8, "weight_scale_inv"), DType::kF32), ScaleCode::kFloat);
  EXPECT_EQ(block_scale_code(fp8, component(fp8, "weight"), DType::kF8E4M3), ScaleCode::kNone);
}

// NaN (0xFF), and 2^126 / 2^127 (0xFD, 0xFE), under which E2M1 values of 4 and 6 (0xFD) or 2 and up (0xFE)
// overflow float: invalid. 0xFC (2^125, times 6 still finite) is not.
TEST(ScaleCodes, E8m0NanAndOverflowingCodesAreInvalidAndZeroIsCounted) {
  const std::vector<uint8_t> codes = {127, 0, 0xFC, 0xFF, 1, 0, 0xFE, 0xFD};
  const ScaleCodeCount n = count_scale_codes(ScaleCode::kE8M0, DType::kU8, codes.data(), codes.size());
  EXPECT_EQ(n.invalid, 3u);
  EXPECT_EQ(n.first_invalid, 3u);
  EXPECT_EQ(n.e8m0_zero, 2u);
  EXPECT_TRUE(std::isfinite(std::ldexp(6.0f, 0xFC - 127)));
  EXPECT_FALSE(std::isfinite(std::ldexp(6.0f, 0xFD - 127)));
}

TEST(ScaleCodes, E4m3NanOfEitherSignAndNegativesAreInvalid) {
  // E4M3 (fn) has no infinity; 0x7E (448) is its largest number. 0x80 (-0) scales a block of zeros as 0x00 does.
  const std::vector<uint8_t> codes = {0x38, 0x7E, 0x80, 0x00, 0xB8, 0xFF, 0x7F, 0xFE};
  const ScaleCodeCount n = count_scale_codes(ScaleCode::kE4M3, DType::kF8E4M3, codes.data(), codes.size());
  EXPECT_EQ(n.invalid, 4u);
  EXPECT_EQ(n.first_invalid, 4u);
  EXPECT_EQ(n.e8m0_zero, 0u);
}

TEST(ScaleCodes, FloatScalesNonFiniteOrNegativeAreInvalidInEveryWidth) {
  // 600 values: past the 256-value chunks the float path converts in.
  std::vector<float> v(600, 0.5f);
  v[0] = 0.0f;   // a zero scale is a block of zeros, not an error
  v[1] = -0.0f;  // nor is -0
  v[300] = std::numeric_limits<float>::infinity();
  v[450] = -0.25f;
  v[599] = std::nanf("");
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<uint8_t> bytes(v.size() * static_cast<size_t>(dtype_bits(d) / 8));
    convert_from_f32(d, v.data(), bytes.data(), static_cast<int64_t>(v.size()));
    const ScaleCodeCount n = count_scale_codes(ScaleCode::kFloat, d, bytes.data(), v.size());
    EXPECT_EQ(n.invalid, 3u) << dtype_name(d);
    EXPECT_EQ(n.first_invalid, 300u) << dtype_name(d);
  }
  // F64 scales are read as f32 by every consumer: 1e300 becomes infinity there and is invalid, 1e30 is not.
  // 1e36 is finite but scales an E4M3 weight of 448 past the float range (kMaxFloatBlockScale, about 7.6e35).
  const double scales[4] = {1e30, 1e300, -1.0, 1e36};
  std::vector<uint8_t> f64(sizeof scales);
  std::memcpy(f64.data(), scales, sizeof scales);
  const ScaleCodeCount n = count_scale_codes(ScaleCode::kFloat, DType::kF64, f64.data(), 4);
  EXPECT_EQ(n.invalid, 3u);
  EXPECT_EQ(n.first_invalid, 1u);
  EXPECT_TRUE(std::isfinite(448.0f * kMaxFloatBlockScale));
  EXPECT_FALSE(std::isfinite(448.0f * std::nextafter(kMaxFloatBlockScale, INFINITY) * 1.0001f));
}

}  // namespace
}  // namespace kimirt::quant
