#include "kimirt/quant/slice.h"

#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "kimirt/base/error.h"

namespace kimirt::quant {
namespace {

using ::testing::HasSubstr;

Tensor iota_f32(Shape shape) {
  Tensor t(DType::kF32, std::move(shape));
  auto s = t.span<float>();
  std::iota(s.begin(), s.end(), 0.0f);
  return t;
}

TEST(Slice, CopiesABoxOfA2DTensor) {
  const Tensor src = iota_f32({4, 6});
  SliceRule rule{{2, 3}, {{0, {{1, 2}, {2, 3}}, {{0, 0}, {2, 3}}}}};
  const Tensor out = apply_slice(src.view(), rule);
  const std::vector<float> want = {8, 9, 10, 14, 15, 16};
  EXPECT_EQ(out.to_f32(), want);
}

TEST(Slice, ConcatenatesTwoSourcesAlongRows) {
  const Tensor a = iota_f32({4, 2});
  Tensor b = iota_f32({4, 2});
  for (auto& v : b.span<float>()) v += 100;
  // Rows 2..3 of each source, a first: the [gate | up] fusion of a rank that holds the second half.
  SliceRule rule{{4, 2}, {{0, {{2, 0}, {2, 2}}, {{0, 0}, {2, 2}}}, {1, {{2, 0}, {2, 2}}, {{2, 0}, {2, 2}}}}};
  const TensorView sources[] = {a.view(), b.view()};
  const Tensor out = apply_slice(sources, rule);
  const std::vector<float> want = {4, 5, 6, 7, 104, 105, 106, 107};
  EXPECT_EQ(out.to_f32(), want);
}

TEST(Slice, CopiesBf16ColumnsOfA3DTensor) {
  Tensor src(DType::kBF16, {2, 3, 4});
  auto s = src.span<uint16_t>();
  std::iota(s.begin(), s.end(), uint16_t{0});
  SliceRule rule{{2, 3, 2}, {{0, {{0, 0, 1}, {2, 3, 2}}, {{0, 0, 0}, {2, 3, 2}}}}};
  const Tensor out = apply_slice(src.view(), rule);
  const auto o = out.span<const uint16_t>();
  const std::vector<uint16_t> got(o.begin(), o.end());
  const std::vector<uint16_t> want = {1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22};
  EXPECT_EQ(got, want);
}

TEST(Slice, CopiesPackedF4ByBytes) {
  // 2 rows x 8 elements = 4 bytes per row; columns [2, 6) are bytes 1..2 of each row.
  Tensor src(DType::kF4, {2, 8});
  auto* b = src.data_as<uint8_t>();
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(0x10 * i + i);
  SliceRule rule{{2, 4}, {{0, {{0, 2}, {2, 4}}, {{0, 0}, {2, 4}}}}};
  const Tensor out = apply_slice(src.view(), rule);
  ASSERT_EQ(out.nbytes(), 4u);
  const auto* o = out.data_as<uint8_t>();
  EXPECT_EQ(o[0], 0x11);
  EXPECT_EQ(o[1], 0x22);
  EXPECT_EQ(o[2], 0x55);
  EXPECT_EQ(o[3], 0x66);
}

TEST(Slice, RefusesAPackedF4RegionThatSplitsAByte) {
  Tensor src(DType::kF4, {2, 8});
  SliceRule rule{{2, 3}, {{0, {{0, 1}, {2, 3}}, {{0, 0}, {2, 3}}}}};
  try {
    apply_slice(src.view(), rule);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("does not start and end on a byte"));
  }
}

// A region whose end passes INT64_MAX: begin + extent wrapped negative and passed the bound, and the copy read
// far outside the tensor. Refused naming the region.
TEST(Slice, RefusesARegionWhoseEndOverflows) {
  Tensor src(DType::kF32, {2, 8});
  const int64_t huge = std::numeric_limits<int64_t>::max();
  SliceRule rule{{1, 1}, {{0, {{huge, 0}, {1, 1}}, {{0, 0}, {1, 1}}}}};
  try {
    apply_slice(src.view(), rule);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("lies outside a tensor of shape"));
  }
}

TEST(Slice, CopiesAScalar) {
  Tensor src(DType::kF32, Shape{});
  *src.data_as<float>() = 2.5f;
  const Tensor out = apply_slice(src.view(), SliceRule{{}, {{0, Region{}, Region{}}}});
  EXPECT_EQ(out.to_f32(), std::vector<float>{2.5f});
}

TEST(Slice, CopiesFromAStridedView) {
  const Tensor src = iota_f32({3, 4});
  // The transpose of src as a strided view: [4, 3] with strides {1, 4}.
  const TensorView t(DType::kF32, {4, 3}, {1, 4}, const_cast<void*>(src.data()));
  const Tensor out = apply_slice(t, SliceRule{{2, 3}, {{0, {{1, 0}, {2, 3}}, {{0, 0}, {2, 3}}}}});
  const std::vector<float> want = {1, 5, 9, 2, 6, 10};
  EXPECT_EQ(out.to_f32(), want);
}

TEST(Slice, RefusesRegionsOutsideTheTensor) {
  const Tensor src = iota_f32({4, 6});
  SliceRule rule{{2, 3}, {{0, {{3, 4}, {2, 3}}, {{0, 0}, {2, 3}}}}};
  EXPECT_THROW(apply_slice(src.view(), rule), Error);
}

TEST(Slice, RefusesMismatchedExtentsAndDtypes) {
  const Tensor src = iota_f32({4, 6});
  Tensor dst(DType::kF32, {4, 6});
  EXPECT_THROW(copy_region(src.view(), {{0, 0}, {2, 3}}, dst.view(), {{0, 0}, {3, 2}}), Error);
  Tensor bf(DType::kBF16, {4, 6});
  EXPECT_THROW(copy_region(src.view(), Region::full(src.shape()), bf.view(), Region::full(bf.shape())), Error);
}

TEST(Slice, RefusesCopiesThatLeaveTheDestinationPartlyEmpty) {
  const Tensor src = iota_f32({4, 6});
  SliceRule rule{{4, 6}, {{0, {{0, 0}, {2, 6}}, {{0, 0}, {2, 6}}}}};
  try {
    apply_slice(src.view(), rule);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("fill 12 of the 24"));
  }
}

TEST(Slice, WritesIntoACallerOwnedDestination) {
  const Tensor src = iota_f32({4, 6});
  Tensor dst(DType::kF32, {2, 6});
  SliceRule rule{{2, 6}, {{0, {{2, 0}, {2, 6}}, {{0, 0}, {2, 6}}}}};
  apply_slice_into(std::span<const TensorView>(std::vector<TensorView>{src.view()}), rule, dst.view());
  EXPECT_EQ(dst.to_f32()[0], 12.0f);
  EXPECT_EQ(dst.to_f32()[11], 23.0f);
  Tensor wrong(DType::kF32, {6, 2});
  EXPECT_THROW(apply_slice_into(std::vector<TensorView>{src.view()}, rule, wrong.view()), Error);
  Tensor bf(DType::kBF16, {2, 6});
  EXPECT_THROW(apply_slice_into(std::vector<TensorView>{src.view()}, rule, bf.view()), Error);
}

TEST(Slice, RefusesAMissingSource) {
  const Tensor src = iota_f32({4, 6});
  SliceRule rule{{4, 6}, {{1, Region::full(src.shape()), Region::full(src.shape())}}};
  EXPECT_THROW(apply_slice(src.view(), rule), Error);
}

}  // namespace
}  // namespace kimirt::quant
