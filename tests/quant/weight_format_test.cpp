#include "common/error_of.h"
#include "kimirt/quant/weight_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "kimirt/base/error.h"

namespace kimirt::quant {
namespace {

using ::testing::HasSubstr;

using ::kimirt::test::error_of;

WeightFormat detect(std::vector<PresentTensor> present) { return detect_weight_format("m.w", present); }

TEST(WeightFormat, DetectsEachFormatFromNamesAndDtypes) {
  EXPECT_EQ(detect({{"weight", DType::kBF16}}), WeightFormat::kFloat);
  EXPECT_EQ(detect({{"weight", std::nullopt}}), WeightFormat::kFloat);
  EXPECT_EQ(detect({{"weight_packed", DType::kU8}, {"weight_scale", DType::kU8}}), WeightFormat::kMxfp4);
  EXPECT_EQ(detect({{"weight", DType::kF8E4M3}, {"weight_scale_inv", DType::kF32}}), WeightFormat::kFp8BlockScaleInv);
  EXPECT_EQ(detect({{"weight", DType::kF8E4M3}, {"weight_scale", DType::kF32}}), WeightFormat::kFp8BlockScale);
  EXPECT_EQ(detect({{"weight", std::nullopt}, {"weight_scale", std::nullopt}}), WeightFormat::kFp8BlockScale);
  EXPECT_EQ(detect({{"weight", DType::kU8},
                    {"weight_scale", DType::kF8E4M3},
                    {"weight_scale_2", DType::kF32},
                    {"input_scale", DType::kF32}}),
            WeightFormat::kNvfp4ModelOpt);
  EXPECT_EQ(
      detect({{"weight_packed", DType::kU8}, {"weight_scale", DType::kF8E4M3}, {"weight_global_scale", DType::kF32}}),
      WeightFormat::kNvfp4CompressedTensors);
}

TEST(WeightFormat, IgnoresTensorsThatAreNoWeightComponent) {
  // The router keeps its correction bias under the same base as its weight.
  EXPECT_EQ(detect({{"weight", DType::kBF16}, {"e_score_correction_bias", DType::kF32}}), WeightFormat::kFloat);
}

TEST(WeightFormat, RefusesAnFp8WeightWithoutItsScale) {
  const auto msg = error_of([] { detect({{"weight", DType::kF8E4M3}}); });
  EXPECT_THAT(msg, HasSubstr("m.w.weight is F8_E4M3 but has no block scale"));
  EXPECT_THAT(msg, HasSubstr("weight_scale_inv"));
}

TEST(WeightFormat, RefusesIncompleteOrMixedSets) {
  EXPECT_THAT(error_of([] { detect({{"weight_packed", DType::kU8}}); }), HasSubstr("m.w.weight_packed has no"));
  EXPECT_THAT(error_of([] {
                detect({{"weight_packed", DType::kU8}, {"weight_scale", DType::kF8E4M3}});
              }),
              HasSubstr("weight_global_scale is missing"));
  EXPECT_THAT(error_of([] {
                detect({{"weight", DType::kU8}, {"weight_scale", DType::kF8E4M3}});
              }),
              HasSubstr("no weight_scale_2"));
  EXPECT_THAT(error_of([] { detect({{"weight", DType::kBF16}, {"weight_packed", DType::kU8}}); }), HasSubstr("both"));
  EXPECT_THAT(error_of([] {
                detect({{"weight", DType::kF8E4M3}, {"weight_scale_inv", DType::kF32}, {"weight_scale", DType::kF32}});
              }),
              HasSubstr("both weight_scale and weight_scale_inv"));
  EXPECT_THAT(error_of([] { detect({{"weight", DType::kU8}}); }), HasSubstr("not a format kimirt knows"));
  EXPECT_THAT(error_of([] { detect({{"weight_scale", DType::kF32}}); }), HasSubstr("no weight tensor"));
  // A BF16 weight paired with an FP8 scale: the scale says FP8, the data does not.
  EXPECT_THAT(error_of([] {
                detect({{"weight", DType::kBF16}, {"weight_scale_inv", DType::kF32}});
              }),
              HasSubstr("m.w.weight is BF16, which a fp8-block(scale_inv) weight cannot hold"));
  EXPECT_THAT(error_of([] {
                detect({{"weight_packed", DType::kU8}, {"weight_scale", DType::kU8}, {"weight_scale_2", DType::kF32}});
              }),
              HasSubstr("m.w.weight_scale_2 does not belong to a mxfp4 weight"));
}

TEST(WeightFormat, ComponentShapesFollowTheTiles) {
  const Shape logical = {300, 3584};
  const auto mx = format_components(WeightFormat::kMxfp4);
  EXPECT_EQ(component_shape(WeightFormat::kMxfp4, mx[0], logical), (Shape{300, 1792}));
  EXPECT_EQ(component_shape(WeightFormat::kMxfp4, mx[1], logical), (Shape{300, 112}));
  const auto fp8 = format_components(WeightFormat::kFp8BlockScale);
  EXPECT_EQ(component_shape(WeightFormat::kFp8BlockScale, fp8[0], logical), logical);
  EXPECT_EQ(component_shape(WeightFormat::kFp8BlockScale, fp8[1], logical), (Shape{3, 28}));
  EXPECT_EQ(component_shape(WeightFormat::kFp8BlockScale, fp8[2], logical), Shape{});
  const auto nv = format_components(WeightFormat::kNvfp4ModelOpt);
  EXPECT_EQ(component_shape(WeightFormat::kNvfp4ModelOpt, nv[1], logical), (Shape{300, 224}));
  const auto fl = format_components(WeightFormat::kFloat);
  EXPECT_EQ(component_shape(WeightFormat::kFloat, fl[0], Shape{12, 1, 4}), (Shape{12, 1, 4}));
}

TEST(WeightFormat, NormalizesFourDimensionalFp8ScalesAndF4Data) {
  const Shape logical = {256, 300};
  Tensor scale4(DType::kF32, {2, 1, 3, 1});
  const auto fp8 = format_components(WeightFormat::kFp8BlockScale);
  const TensorView n = normalize_component(WeightFormat::kFp8BlockScale, fp8[1], scale4.view(), logical, "s");
  EXPECT_EQ(n.shape(), (Shape{2, 3}));
  EXPECT_EQ(n.data(), scale4.data());

  Tensor f4(DType::kF4, {4, 8});
  const auto mx = format_components(WeightFormat::kMxfp4);
  const TensorView p = normalize_component(WeightFormat::kMxfp4, mx[0], f4.view(), Shape{4, 8}, "p");
  EXPECT_EQ(p.dtype(), DType::kU8);
  EXPECT_EQ(p.shape(), (Shape{4, 4}));

  Tensor one(DType::kF32, {1});
  const auto nv = format_components(WeightFormat::kNvfp4ModelOpt);
  EXPECT_EQ(normalize_component(WeightFormat::kNvfp4ModelOpt, nv[2], one.view(), Shape{4, 32}, "g").rank(), 0);
}

TEST(WeightFormat, RefusesAScaleGridThatDoesNotCoverTheWeight) {
  const auto fp8 = format_components(WeightFormat::kFp8BlockScaleInv);
  Tensor small(DType::kF32, {2, 2});
  const auto msg = error_of([&] {
    normalize_component(WeightFormat::kFp8BlockScaleInv, fp8[1], small.view(), Shape{300, 256}, "x.weight_scale_inv");
  });
  EXPECT_THAT(msg, HasSubstr("x.weight_scale_inv: scale grid [2, 2] does not cover the weight [300, 256]"));
  Tensor bf(DType::kBF16, {300, 256});
  EXPECT_THAT(error_of([&] {
                normalize_component(WeightFormat::kFp8BlockScaleInv, fp8[0], bf.view(), Shape{300, 256}, "x.weight");
              }),
              HasSubstr("x.weight: dtype BF16 is not valid"));
  // Resolved as float from names alone, the header then shows FP8: the same refusal as detection's.
  Tensor f8(DType::kF8E4M3, {300, 256});
  const auto fl = format_components(WeightFormat::kFloat);
  EXPECT_THAT(error_of([&] {
                normalize_component(WeightFormat::kFloat, fl[0], f8.view(), Shape{300, 256}, "x.weight");
              }),
              HasSubstr("x.weight is F8_E4M3 but has no block scale"));
  const auto mx = format_components(WeightFormat::kMxfp4);
  Tensor packed(DType::kU8, {64, 63});
  EXPECT_THAT(error_of([&] {
                normalize_component(WeightFormat::kMxfp4, mx[0], packed.view(), Shape{64, 128}, "e.weight_packed");
              }),
              HasSubstr("e.weight_packed: shape [64, 63] != expected [64, 64]"));
}

TEST(WeightFormat, MapsLogicalRegionsOntoComponents) {
  const auto mx = format_components(WeightFormat::kMxfp4);
  const Shape logical = {64, 128};
  const Region cols{{0, 64}, {64, 64}};
  EXPECT_EQ(component_region(mx[0], logical, cols, "k"), (Region{{0, 32}, {64, 32}}));
  EXPECT_EQ(component_region(mx[1], logical, cols, "k"), (Region{{0, 2}, {64, 2}}));

  const auto fp8 = format_components(WeightFormat::kFp8BlockScale);
  // The last block may be partial: rows [256, 300) of 300 are scale row 2.
  EXPECT_EQ(component_region(fp8[1], Shape{300, 256}, Region{{256, 0}, {44, 256}}, "k"), (Region{{2, 0}, {1, 2}}));
  EXPECT_EQ(component_region(fp8[2], Shape{300, 256}, Region{{256, 0}, {44, 256}}, "k"), Region{});
}

TEST(WeightFormat, RefusesRegionsThatCutATile) {
  const auto mx = format_components(WeightFormat::kMxfp4);
  const auto msg = error_of([&] { component_region(mx[1], Shape{128, 64}, Region{{0, 16}, {128, 16}}, "w2.scale"); });
  EXPECT_THAT(msg, HasSubstr("w2.scale: columns [16, 32) of a [128, 64] weight cut a 1x32 block of its weight_scale; "
                             "pieces must be multiples of 32 columns"));
  const auto fp8 = format_components(WeightFormat::kFp8BlockScaleInv);
  EXPECT_THAT(error_of([&] {
                component_region(fp8[1], Shape{512, 256}, Region{{192, 0}, {64, 256}}, "q.s");
              }),
              HasSubstr("rows [192, 256) of a [512, 256] weight cut a 128x128 block of its weight_scale_inv"));
  EXPECT_THAT(error_of([&] {
                component_region(mx[0], Shape{4, 8}, Region{{0, 3}, {4, 4}}, "p");
              }),
              HasSubstr("cut a 1x2 block of its weight_packed"));
}

TEST(WeightFormat, FormatSetsNameTheirMembers) {
  const FormatSet s{WeightFormat::kFloat, WeightFormat::kMxfp4};
  EXPECT_TRUE(s.contains(WeightFormat::kMxfp4));
  EXPECT_FALSE(s.contains(WeightFormat::kFp8BlockScale));
  EXPECT_EQ(s.str(), "float|mxfp4");
  EXPECT_TRUE(FormatSet::all().contains(WeightFormat::kNvfp4CompressedTensors));
}

}  // namespace
}  // namespace kimirt::quant
