// The NaN and infinity codes of each dtype, counted as stored, and nothing else: the largest finite values
// and the other special codes (E4M3 has no infinity, E8M0 no zero) are finite.
#include "kimirt/tensor/finite_values.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

namespace kimirt {
namespace {

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& codes) {
  std::vector<uint8_t> b(codes.size() * sizeof(T));
  std::memcpy(b.data(), codes.data(), b.size());
  return b;
}

TEST(FiniteValues, EachDtypesCodes) {
  struct Case {
    DType dtype;
    std::vector<uint8_t> data;
    uint64_t count, bad, first;
  };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const double dinf = std::numeric_limits<double>::infinity();
  const Case cases[] = {
      {DType::kF32, bytes_of<float>({1.0f, std::numeric_limits<float>::max(), -inf, 0.0f, nan}), 5, 2, 2},
      {DType::kF64, bytes_of<double>({std::numeric_limits<double>::max(), dinf, -0.0}), 3, 1, 1},
      // F16: 0x7BFF max, 0x7C00 inf, 0xFE00 NaN; BF16: 0x7F7F max, 0xFF80 -inf, 0x7FC1 NaN.
      {DType::kF16, bytes_of<uint16_t>({0x7BFF, 0x3C00, 0x7C00, 0xFE00}), 4, 2, 2},
      {DType::kBF16, bytes_of<uint16_t>({0x7F7F, 0xFF80, 0x3F80, 0x7FC1}), 4, 2, 1},
      // E4M3: 0x7E (448) and 0xFE are finite, 0x7F / 0xFF NaN; E5M2: 0x7B max, 0x7C inf, 0xFF NaN.
      {DType::kF8E4M3, {0x7E, 0xFE, 0x7F, 0x00, 0xFF}, 5, 2, 2},
      {DType::kF8E5M2, {0x7B, 0x7C, 0x01, 0xFF}, 4, 2, 1},
      // E8M0: 0x00 is 2^-127 and 0xFE 2^127, both finite; 0xFF NaN.
      {DType::kF8E8M0, {0x00, 0xFE, 0x7F, 0xFF}, 4, 1, 3},
      {DType::kU8, {0xFF, 0x7F}, 2, 0, 99},
      {DType::kI32, bytes_of<int32_t>({-1, 0x7F800000}), 2, 0, 99},
      {DType::kF4, {0xFF, 0x77}, 4, 0, 99},
  };
  for (const auto& c : cases) {
    uint64_t first = 99;
    EXPECT_EQ(count_nonfinite(c.dtype, c.data.data(), c.count, &first), c.bad) << dtype_name(c.dtype);
    EXPECT_EQ(first, c.first) << dtype_name(c.dtype);
    EXPECT_EQ(has_nonfinite_codes(c.dtype), c.dtype != DType::kU8 && c.dtype != DType::kI32 && c.dtype != DType::kF4)
        << dtype_name(c.dtype);
  }
}

// Pieces cut at every offset, elements split between them included, count what one pass over the bytes counts.
TEST(FiniteValues, PiecesCutAnywhereCountAsOne) {
  std::vector<uint32_t> codes(37, 0x3F800000u);  // 1.0f
  codes[0] = 0x7F800000u, codes[13] = 0xFFC00000u, codes[36] = 0x7F800001u;
  const std::vector<uint8_t> bytes = bytes_of(codes);
  for (uint64_t cut = 1; cut <= 9; ++cut) {
    NonfiniteCount c(DType::kF32);
    for (uint64_t at = 0; at < bytes.size(); at += cut) c.add(bytes.data() + at, std::min(cut, bytes.size() - at));
    EXPECT_EQ(c.elements(), 37u) << cut;
    EXPECT_EQ(c.nonfinite(), 3u) << cut;
    EXPECT_EQ(c.first(), 0u) << cut;
    EXPECT_EQ(c.pending_bytes(), 0u) << cut;
  }
  // The first bad element at index 13, split between pieces at most cuts.
  std::vector<uint32_t> later(37, 0x3F800000u);
  later[13] = 0xFF800000u;
  const std::vector<uint8_t> later_bytes = bytes_of(later);
  for (uint64_t cut = 1; cut <= 9; ++cut) {
    NonfiniteCount c(DType::kF32);
    for (uint64_t at = 0; at < later_bytes.size(); at += cut) {
      c.add(later_bytes.data() + at, std::min(cut, later_bytes.size() - at));
    }
    EXPECT_EQ(c.nonfinite(), 1u) << cut;
    EXPECT_EQ(c.first(), 13u) << cut;
  }
  NonfiniteCount c(DType::kF32);
  c.add(bytes.data() + 4, 10);  // elements 1, 2 and half of 3
  EXPECT_EQ(c.elements(), 2u);
  EXPECT_EQ(c.pending_bytes(), 2u);
  c.add(bytes.data() + 14, 42);  // the rest of 3, then 4 .. 13 (13 is NaN)
  EXPECT_EQ(c.elements(), 13u);
  EXPECT_EQ(c.nonfinite(), 1u);
  EXPECT_EQ(c.first(), 12u) << "element 13 of the tensor is the 13th given (index 12)";
}

}  // namespace
}  // namespace kimirt
