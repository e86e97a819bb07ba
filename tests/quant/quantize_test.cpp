#include "kimirt/quant/quantize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kimirt/base/error.h"
#include "kimirt/quant/dequant.h"
#include "kimirt/tensor/float_convert.h"

namespace kimirt::quant {
namespace {

std::vector<float> roundtrip(WeightFormat format, const std::vector<float>& v, const Shape& shape) {
  const QuantizedWeight q = quantize(format, v, shape);
  const auto views = q.views();
  return dequantize(format, views, shape, "t").to_f32();
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * double(got[i] - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> normal(size_t n, float sigma, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Group amax 3: floor(log2 3) - 2 = -1, so the scale is 2^-1 (E8M0 code 126) and the elements are 2, -6, 1.5.
TEST(Quantize, Mxfp4FollowsTheOcpScaleRule) {
  std::vector<float> v(64, 0.0f);
  v[0] = 1.0f;
  v[1] = -3.0f;
  v[2] = 0.75f;
  v[32] = 5.0f;  // group 1: amax 5 -> scale 2^0; 5 is halfway between 4 and 6 and rounds to even (4)
  const QuantizedWeight q = quantize(WeightFormat::kMxfp4, v, {1, 64});
  ASSERT_EQ(q.parts.size(), 2u);
  const auto* packed = q.parts[0].data_as<uint8_t>();
  const auto* scale = q.parts[1].data_as<uint8_t>();
  EXPECT_EQ(scale[0], 126);
  EXPECT_EQ(scale[1], 127);
  EXPECT_EQ(packed[0], 0xF4);   // low: code 4 (2.0), high: code 15 (-6.0)
  EXPECT_EQ(packed[1], 0x03);   // low: code 3 (1.5)
  EXPECT_EQ(packed[16], 0x06);  // code 6 (4.0)
  const auto back = roundtrip(WeightFormat::kMxfp4, v, {1, 64});
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -3.0f);
  EXPECT_EQ(back[2], 0.75f);
  EXPECT_EQ(back[32], 4.0f);
}

TEST(Quantize, Mxfp4ZeroGroupsGetUnitScale) {
  const std::vector<float> v(32, 0.0f);
  const QuantizedWeight q = quantize(WeightFormat::kMxfp4, v, {1, 32});
  EXPECT_EQ(q.parts[1].data_as<uint8_t>()[0], 127);
}

// Block amax 896 gives scale 896 / 448 = 2; 896 -> E4M3 448 (0x7E), 3 -> 1.5 (0x3C).
TEST(Quantize, Fp8BlockScaleIsAmaxOver448) {
  std::vector<float> v(2 * 130, 0.0f);
  v[0] = 896.0f;
  v[1] = 3.0f;
  v[129] = -7.0f;  // column 129 is in the second column block: amax 7 -> scale 7/448
  const QuantizedWeight q = quantize(WeightFormat::kFp8BlockScaleInv, v, {2, 130});
  ASSERT_EQ(q.parts[1].shape(), (Shape{1, 2}));
  EXPECT_EQ(q.parts[1].data_as<float>()[0], 2.0f);
  EXPECT_EQ(q.parts[1].data_as<float>()[1], 7.0f / 448.0f);
  EXPECT_EQ(q.parts[0].data_as<uint8_t>()[0], 0x7E);
  EXPECT_EQ(q.parts[0].data_as<uint8_t>()[1], 0x3C);
  EXPECT_EQ(q.parts[0].data_as<uint8_t>()[129], 0xFE);  // -448
  const auto back = roundtrip(WeightFormat::kFp8BlockScaleInv, v, {2, 130});
  EXPECT_EQ(back[0], 896.0f);
  EXPECT_EQ(back[1], 3.0f);
  EXPECT_EQ(back[129], -7.0f);
}

// With amax = 6 * 448 both global scales are 1, so group scales are amax16 / 6 exactly.
TEST(Quantize, Nvfp4GlobalScaleConventions) {
  std::vector<float> v(32, 0.0f);
  v[0] = 2688.0f;  // 6 * 448
  v[16] = 3.0f;
  v[17] = -1.0f;
  for (auto format : {WeightFormat::kNvfp4ModelOpt, WeightFormat::kNvfp4CompressedTensors}) {
    const QuantizedWeight q = quantize(format, v, {1, 32});
    EXPECT_EQ(*q.parts[2].data_as<float>(), 1.0f) << format_name(format);
    EXPECT_EQ(e4m3_to_f32(q.parts[1].data_as<uint8_t>()[0]), 448.0f);
    EXPECT_EQ(e4m3_to_f32(q.parts[1].data_as<uint8_t>()[1]), 0.5f);
    const auto back = roundtrip(format, v, {1, 32});
    EXPECT_EQ(back[0], 2688.0f);
    EXPECT_EQ(back[16], 3.0f);
    EXPECT_EQ(back[17], -1.0f);
  }
  // amax 12: ModelOpt stores the multiplier 12 / 2688, compressed-tensors the divisor 2688 / 12.
  std::vector<float> w(16, 0.0f);
  w[3] = 12.0f;
  EXPECT_EQ(*quantize(WeightFormat::kNvfp4ModelOpt, w, {1, 16}).parts[2].data_as<float>(), 12.0f / 2688.0f);
  EXPECT_EQ(*quantize(WeightFormat::kNvfp4CompressedTensors, w, {1, 16}).parts[2].data_as<float>(), 2688.0f / 12.0f);
}

// Round-trip error on N(0, 1) weights, ‖out − ref‖/‖ref‖. Bounds are about 1.3x the measured values:
// MXFP4 0.114, NVFP4 0.096 (finer groups, finer scales), FP8 block 0.026, BF16 0.0017.
TEST(Quantize, RoundTripErrorIsWithinEachFormatsResolution) {
  const Shape shape = {256, 384};
  const auto v = normal(256 * 384, 1.0f, 7);
  EXPECT_LT(rel_error(roundtrip(WeightFormat::kMxfp4, v, shape), v), 0.15);
  EXPECT_LT(rel_error(roundtrip(WeightFormat::kNvfp4ModelOpt, v, shape), v), 0.125);
  EXPECT_LT(rel_error(roundtrip(WeightFormat::kNvfp4CompressedTensors, v, shape), v), 0.125);
  EXPECT_LT(rel_error(roundtrip(WeightFormat::kFp8BlockScale, v, shape), v), 0.035);
  EXPECT_LT(rel_error(roundtrip(WeightFormat::kFloat, v, shape), v), 2.2e-3);
  EXPECT_GT(rel_error(roundtrip(WeightFormat::kMxfp4, v, shape), v), 0.05);  // it does quantize
}

TEST(Quantize, RefusesNonFiniteValuesAndOddPackedWidths) {
  std::vector<float> v(4, 1.0f);
  v[2] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(quantize(WeightFormat::kFp8BlockScale, v, {2, 2}), Error);
  const std::vector<float> w(6, 1.0f);
  EXPECT_THROW(quantize(WeightFormat::kMxfp4, w, {2, 3}), Error);
  EXPECT_THROW(quantize(WeightFormat::kMxfp4, w, {6}), Error);
  EXPECT_THROW(quantize(WeightFormat::kFloat, w, {6}, DType::kU8), Error);
  // Finite values the stored dtype cannot hold: they would have been stored as infinity.
  const std::vector<float> big = {1.0f, 70000.0f};
  EXPECT_THROW(quantize(WeightFormat::kFloat, big, {2}, DType::kF16), Error);
  EXPECT_NO_THROW(quantize(WeightFormat::kFloat, big, {2}, DType::kBF16));
  // A compressed-tensors NVFP4 weight this small has a global scale (2688 / amax) past the float range, which
  // dequantize refuses: refused when written instead.
  std::vector<float> tiny(16, 0.0f);
  tiny[0] = 1e-37f;
  EXPECT_THROW(quantize(WeightFormat::kNvfp4CompressedTensors, tiny, {1, 16}), Error);
  EXPECT_NO_THROW(quantize(WeightFormat::kNvfp4ModelOpt, tiny, {1, 16}));
}

}  // namespace
}  // namespace kimirt::quant
