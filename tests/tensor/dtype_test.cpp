#include "kimirt/tensor/dtype.h"

#include <gtest/gtest.h>

#include "kimirt/tensor/tensor.h"

namespace kimirt {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType d : kAllDTypes) {
    auto parsed = parse_dtype(dtype_name(d));
    ASSERT_TRUE(parsed.has_value()) << dtype_name(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(dtype_name(DType::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(dtype_name(DType::kF4), "F4");
  EXPECT_FALSE(parse_dtype("f32").has_value());
  EXPECT_FALSE(parse_dtype("C64").has_value());
  EXPECT_TRUE(is_unsupported_safetensors_dtype("C64"));
  EXPECT_FALSE(is_unsupported_safetensors_dtype("Q4"));
}

TEST(DType, Bytes) {
  EXPECT_EQ(dtype_bytes(DType::kBF16, 3), 6u);
  EXPECT_EQ(dtype_bytes(DType::kF4, 4), 2u);
  EXPECT_FALSE(dtype_bytes(DType::kF4, 3).has_value());
  EXPECT_FALSE(dtype_bytes(DType::kF64, UINT64_MAX / 8).has_value());
}

TEST(Tensor, ShapesAndViews) {
  Tensor t(DType::kF32, {3, 4});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 48u);
  auto s = t.span<float>();
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(i);
  TensorView rows = t.view().slice_rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 4}));
  EXPECT_EQ(rows.data_as<float>()[0], 4.0f);
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.reshape({8}).numel(), 8);
  EXPECT_THROW(rows.reshape({9}), Error);
  EXPECT_THROW(t.view().slice_rows(2, 4), Error);
  EXPECT_THROW((void)t.view().span<uint16_t>(), Error);
  EXPECT_THROW(Tensor(DType::kF32, {-1, 2}), Error);
  EXPECT_THROW(Tensor(DType::kF4, {3}), Error);
  EXPECT_THROW(shape_numel(Shape{INT64_MAX, 3}), Error);
}

TEST(Tensor, StridedView) {
  Tensor t(DType::kF32, {2, 3});
  TensorView transposed(DType::kF32, {3, 2}, {1, 3}, t.data());
  EXPECT_FALSE(transposed.is_contiguous());
  EXPECT_THROW(TensorView(DType::kF4, {2, 2}, {1, 2}, t.data()), Error);
}

}  // namespace
}  // namespace kimirt
