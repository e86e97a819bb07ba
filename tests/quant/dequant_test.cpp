#include "kimirt/quant/dequant.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "common/error_of.h"
#include "kimirt/base/error.h"
#include "kimirt/quant/scale_codes.h"
#include "kimirt/tensor/float_convert.h"

namespace kimirt::quant {
namespace {

using test::error_of;
using ::testing::HasSubstr;

float at(const Tensor& t, int64_t r, int64_t c) { return t.data_as<float>()[r * t.dim(1) + c]; }

TEST(Dequant, PlainFloatsConvert) {
  Tensor w(DType::kBF16, {2, 2});
  auto s = w.span<uint16_t>();
  s[0] = f32_to_bf16(1.5f);
  s[1] = f32_to_bf16(-2.0f);
  s[2] = f32_to_bf16(0.25f);
  s[3] = f32_to_bf16(3.0f);
  const TensorView parts[] = {w.view()};
  const Tensor out = dequantize(WeightFormat::kFloat, parts, w.shape(), "w");
  EXPECT_EQ(out.to_f32(), (std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f}));
}

// Two rows of 64 elements: two E8M0 groups per row; element 2i in the low nibble.
TEST(Dequant, Mxfp4HandComputed) {
  Tensor packed(DType::kU8, {2, 32});
  Tensor scale(DType::kU8, {2, 2});
  auto* p = packed.data_as<uint8_t>();
  auto* s = scale.data_as<uint8_t>();
  s[0] = 127;  // 2^0
  s[1] = 125;  // 2^-2
  s[2] = 130;  // 2^3
  s[3] = 127;
  p[0] = 0x21;        // el 0: code 1 = 0.5, el 1: code 2 = 1.0
  p[1] = 0xF7;        // el 2: code 7 = 6.0, el 3: code 15 = -6.0
  p[16] = 0x9A;       // el 32: code 10 = -1.0, el 33: code 9 = -0.5 (group 1, x 0.25)
  p[32 + 0] = 0x03;   // row 1, el 0: code 3 = 1.5 (x 8)
  p[32 + 31] = 0xC0;  // row 1, el 62: 0, el 63: code 12 = -2.0 (group 1, x 1)
  const TensorView parts[] = {packed.view(), scale.view()};
  const Tensor w = dequantize(WeightFormat::kMxfp4, parts, Shape{2, 64}, "e");
  EXPECT_EQ(at(w, 0, 0), 0.5f);
  EXPECT_EQ(at(w, 0, 1), 1.0f);
  EXPECT_EQ(at(w, 0, 2), 6.0f);
  EXPECT_EQ(at(w, 0, 3), -6.0f);
  EXPECT_EQ(at(w, 0, 4), 0.0f);
  EXPECT_EQ(at(w, 0, 32), -0.25f);
  EXPECT_EQ(at(w, 0, 33), -0.125f);
  EXPECT_EQ(at(w, 1, 0), 12.0f);
  EXPECT_EQ(at(w, 1, 1), 0.0f);
  EXPECT_EQ(at(w, 1, 62), 0.0f);
  EXPECT_EQ(at(w, 1, 63), -2.0f);
  float sum = 0;
  for (float v : w.to_f32()) sum += v;
  EXPECT_EQ(sum, 0.5f + 1.0f + 6.0f - 6.0f - 0.25f - 0.125f + 12.0f - 2.0f);
}

// 130 x 129 with a 2 x 2 grid of 128 x 128 blocks; the last row and column blocks are partial.
TEST(Dequant, Fp8BlockHandComputedBothNamings) {
  Tensor w(DType::kF8E4M3, {130, 129});
  Tensor s(DType::kF32, {2, 2});
  auto* wb = w.data_as<uint8_t>();
  auto* sf = s.data_as<float>();
  sf[0] = 1.0f;
  sf[1] = 2.0f;
  sf[2] = 0.5f;
  sf[3] = 4.0f;
  wb[0] = 0x38;                // 1.0 in block (0, 0)
  wb[128] = 0x40;              // 2.0 in block (0, 1) -> 4
  wb[129 * 129] = 0xB8;        // -1.0 at (129, 0), block (1, 0) -> -0.5
  wb[129 * 129 + 128] = 0x3C;  // 1.5 at (129, 128), block (1, 1) -> 6
  wb[127 * 129 + 127] = 0x30;  // 0.5 at (127, 127), still block (0, 0)
  for (auto format : {WeightFormat::kFp8BlockScaleInv, WeightFormat::kFp8BlockScale}) {
    const TensorView parts[] = {w.view(), s.view(), TensorView()};
    const Tensor out = dequantize(format, parts, w.shape(), "q");
    EXPECT_EQ(at(out, 0, 0), 1.0f);
    EXPECT_EQ(at(out, 0, 128), 4.0f);
    EXPECT_EQ(at(out, 129, 0), -0.5f);
    EXPECT_EQ(at(out, 129, 128), 6.0f);
    EXPECT_EQ(at(out, 127, 127), 0.5f);
    EXPECT_EQ(at(out, 1, 1), 0.0f);
  }
}

TEST(Dequant, Fp8ScalesMayBeBf16) {
  Tensor w(DType::kF8E4M3, {1, 2});
  w.data_as<uint8_t>()[0] = 0x38;
  w.data_as<uint8_t>()[1] = 0x3C;
  Tensor s(DType::kBF16, {1, 1});
  s.data_as<uint16_t>()[0] = f32_to_bf16(0.25f);
  const TensorView parts[] = {w.view(), s.view(), TensorView()};
  EXPECT_EQ(dequantize(WeightFormat::kFp8BlockScale, parts, w.shape(), "q").to_f32(),
            (std::vector<float>{0.25f, 0.375f}));
}

// The same bytes under the two NVFP4 conventions: ModelOpt multiplies by 0.5, compressed-tensors divides by 2.
TEST(Dequant, Nvfp4HandComputedBothConventions) {
  Tensor packed(DType::kU8, {1, 16});
  Tensor scale(DType::kF8E4M3, {1, 2});
  auto* p = packed.data_as<uint8_t>();
  scale.data_as<uint8_t>()[0] = 0x38;  // 1.0
  scale.data_as<uint8_t>()[1] = 0x40;  // 2.0
  p[0] = 0x72;                         // el 0: code 2 = 1.0, el 1: code 7 = 6.0
  p[8] = 0x0B;                         // el 16: code 11 = -1.5, el 17: 0
  Tensor multiplier = Tensor::from_f32(std::vector<float>{0.5f}, Shape{});
  Tensor divisor = Tensor::from_f32(std::vector<float>{2.0f}, Shape{});
  const TensorView mo[] = {packed.view(), scale.view(), multiplier.view(), TensorView()};
  const TensorView ct[] = {packed.view(), scale.view(), divisor.view(), TensorView()};
  for (const Tensor& w : {dequantize(WeightFormat::kNvfp4ModelOpt, mo, Shape{1, 32}, "n"),
                          dequantize(WeightFormat::kNvfp4CompressedTensors, ct, Shape{1, 32}, "n")}) {
    EXPECT_EQ(at(w, 0, 0), 0.5f);
    EXPECT_EQ(at(w, 0, 1), 3.0f);
    EXPECT_EQ(at(w, 0, 16), -1.5f);
    EXPECT_EQ(at(w, 0, 17), 0.0f);
  }
}

TEST(Dequant, RefusesMissingOrMisshapenParts) {
  Tensor packed(DType::kU8, {2, 32});
  Tensor bad_scale(DType::kU8, {2, 3});
  const TensorView parts[] = {packed.view(), bad_scale.view()};
  try {
    dequantize(WeightFormat::kMxfp4, parts, Shape{2, 64}, "layers.1.experts.0.w1");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("layers.1.experts.0.w1: weight_scale has shape [2, 3], expected [2, 2]"));
  }
  // Two values per byte: an odd column count is refused (the rows were stepped by the wrong length and the
  // last value written past the end).
  Tensor scale(DType::kU8, {2, 2});
  const TensorView odd[] = {packed.view(), scale.view()};
  EXPECT_THAT(error_of([&] {
                dequantize(WeightFormat::kMxfp4, odd, Shape{2, 63}, "l.w");
              }),
              HasSubstr("l.w: a packed FP4 weight needs 2 dims and an even column count, got [2, 63]"));
  const TensorView missing[] = {packed.view(), TensorView()};
  EXPECT_THAT(error_of([&] {
                dequantize(WeightFormat::kMxfp4, missing, Shape{2, 64}, "w");
              }),
              HasSubstr("w: the weight_scale of a"));
  // A weight with no rows is present, not missing: its parts have shapes (and no bytes).
  Tensor packed0(DType::kU8, {0, 32}), scale0(DType::kU8, {0, 2});
  const TensorView empty_rows[] = {packed0.view(), scale0.view()};
  const Tensor none = dequantize(WeightFormat::kMxfp4, empty_rows, Shape{0, 64}, "w");
  EXPECT_EQ(none.shape(), (Shape{0, 64}));
  Tensor zero = Tensor::from_f32(std::vector<float>{0.0f}, Shape{});
  Tensor nv_scale(DType::kF8E4M3, {2, 4});
  const TensorView nv[] = {packed.view(), nv_scale.view(), zero.view(), TensorView()};
  EXPECT_THROW(dequantize(WeightFormat::kNvfp4CompressedTensors, nv, Shape{2, 64}, "w"), Error);
  // A global scale that is not a finite number would turn every weight into NaN or infinity, a negative one
  // flip every sign: refused, named.
  for (float g : {std::nanf(""), INFINITY, -INFINITY, -0.5f}) {
    SCOPED_TRACE(g);
    Tensor global = Tensor::from_f32(std::vector<float>{g}, Shape{});
    const TensorView parts2[] = {packed.view(), nv_scale.view(), global.view(), TensorView()};
    EXPECT_THAT(error_of([&] {
                  dequantize(WeightFormat::kNvfp4ModelOpt, parts2, Shape{2, 64}, "l.w");
                }),
                HasSubstr("l.w: weight_scale_2 is"));
    EXPECT_THAT(error_of([&] {
                  dequantize(WeightFormat::kNvfp4CompressedTensors, parts2, Shape{2, 64}, "l.w");
                }),
                HasSubstr("l.w: weight_global_scale is"));
  }
  // Finite, but so large (ModelOpt multiplies) or so small (compressed-tensors divides) that group scale 448
  // times E2M1 6 overflows float: the bounds themselves are taken, one step past them refused.
  for (const auto& [format, ok, bad, field] :
       {std::tuple{WeightFormat::kNvfp4ModelOpt, kMaxNvfp4GlobalMultiplier,
                   std::nextafter(kMaxNvfp4GlobalMultiplier, INFINITY), "weight_scale_2"},
        std::tuple{WeightFormat::kNvfp4CompressedTensors, kMinNvfp4GlobalDivisor,
                   std::nextafter(kMinNvfp4GlobalDivisor, 0.0f), "weight_global_scale"}}) {
    Tensor top(DType::kF8E4M3, {2, 4});
    std::fill_n(top.data_as<uint8_t>(), top.numel(), uint8_t{0x7E});  // 448
    Tensor sixes(DType::kU8, {2, 32});
    std::fill_n(sixes.data_as<uint8_t>(), sixes.numel(), uint8_t{0x77});  // E2M1 6 in both nibbles
    Tensor good = Tensor::from_f32(std::vector<float>{ok}, Shape{});
    const TensorView fine[] = {sixes.view(), top.view(), good.view(), TensorView()};
    const Tensor w = dequantize(format, fine, Shape{2, 64}, "l.w");
    for (const float v : std::span<const float>(w.data_as<float>(), 128)) ASSERT_TRUE(std::isfinite(v)) << field;
    Tensor past = Tensor::from_f32(std::vector<float>{bad}, Shape{});
    const TensorView over[] = {sixes.view(), top.view(), past.view(), TensorView()};
    EXPECT_THAT(error_of([&] {
                  dequantize(format, over, Shape{2, 64}, "l.w");
                }),
                HasSubstr(std::string("l.w: ") + field + " is"));
  }
}

}  // namespace
}  // namespace kimirt::quant
