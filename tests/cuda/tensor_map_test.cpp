// Tensor maps: each rule of cuTensorMapEncodeTiled that an argument breaks is named with its field and limit
// before the driver is asked, and a map within the rules encodes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kimirt/base/error.h"
#include "kimirt/cuda/memory.h"
#include "kimirt/cuda/tensor_map.h"
#include "test_util.h"

namespace kimirt::cuda {
namespace {

// A [rows, 576] BF16 matrix copied in boxes of 32 rows x 64 columns (128 bytes) under the 128-byte swizzle, as
// the MLA kernels map their cache.
struct Map {
  CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  int rank = 2;
  const void* base = reinterpret_cast<const void*>(uintptr_t{1} << 20);
  uint64_t dims[5] = {576, 4096, 1, 1, 1};
  uint64_t strides[4] = {576 * 2, 0, 0, 0};
  uint32_t box[5] = {64, 32, 1, 1, 1};
  CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B;

  std::string problem() const { return tensor_map_problem(type, rank, base, dims, strides, box, swizzle); }
};

void expect_problem(const Map& m, const std::string& expected) {
  const std::string got = m.problem();
  EXPECT_NE(got.find(expected), std::string::npos) << "got '" << got << "', expected it to hold '" << expected << "'";
}

TEST(TensorMap, EachBrokenRuleIsNamedWithItsLimit) {
  EXPECT_EQ(Map{}.problem(), "");
  Map m;
  m.rank = 0;
  expect_problem(m, "rank 0 outside 1..5");
  m = Map{};
  m.rank = 6;
  expect_problem(m, "rank 6 outside 1..5");
  m = Map{};
  m.base = reinterpret_cast<const void*>((uintptr_t{1} << 20) + 8);
  expect_problem(m, "not 16-byte aligned");
  m = Map{};
  m.dims[1] = 0;
  expect_problem(m, "dims[1] = 0 outside 1..2^32");
  m = Map{};
  m.dims[1] = (uint64_t{1} << 32) + 1;
  expect_problem(m, "dims[1] = 4294967297 outside 1..2^32");
  m = Map{};
  m.box[1] = 257;
  expect_problem(m, "box[1] = 257 outside 1..256");
  m = Map{};
  m.box[0] = 0;
  expect_problem(m, "box[0] = 0 outside 1..256");
  m = Map{};
  m.strides[0] = 1160;
  expect_problem(m, "strides_bytes[0] = 1160 not a multiple of 16 below 2^40");
  m = Map{};
  m.strides[0] = uint64_t{1} << 40;
  expect_problem(m, "strides_bytes[0] = 1099511627776");
  m = Map{};
  m.box[0] = 4;  // 8 bytes
  m.swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
  expect_problem(m, "box[0] = 4 elements = 8 bytes, not a multiple of 16");
  m = Map{};
  m.box[0] = 128;  // 256 bytes
  expect_problem(m, "box[0] = 128 elements = 256 bytes, past the swizzle's 128-byte span");
  m.swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
  EXPECT_EQ(m.problem(), "");
  m = Map{};
  m.swizzle = CU_TENSOR_MAP_SWIZZLE_64B;
  expect_problem(m, "past the swizzle's 64-byte span");
  // FP8 (one byte) and float (four) rows: the 16-byte rule counts bytes, not elements.
  m = Map{};
  m.type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  m.box[0] = 128;
  EXPECT_EQ(m.problem(), "");
  m.box[0] = 8;
  expect_problem(m, "8 bytes, not a multiple of 16");
  m = Map{};
  m.type = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  m.swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
  m.box[0] = 4;  // the FP8 GEMM's four weight scales
  EXPECT_EQ(m.problem(), "");
}

TEST(TensorMap, RefusalsNameTheTensorAndValidMapsEncode) {
  KIMIRT_REQUIRE_GPU();
  DeviceBuffer buffer(uint64_t{576} * 4096 * 2);
  Map m;
  m.base = buffer.data();
  EXPECT_NO_THROW(make_tensor_map(m.type, m.rank, m.base, m.dims, m.strides, m.box, m.swizzle, "cache"));
  m.box[1] = 300;
  try {
    (void)make_tensor_map(m.type, m.rank, m.base, m.dims, m.strides, m.box, m.swizzle, "the test's cache");
    ADD_FAILURE() << "a box of 300 rows was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor map for the test's cache: box[1] = 300 outside 1..256"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kimirt::cuda
