#include "kimirt/tensor/dtype.h"

#include <array>

#include "kimirt/base/error.h"

namespace kimirt {
namespace {

struct Info {
  DType dtype;
  std::string_view name;
  int bits;
  bool is_float;
};

constexpr std::array<Info, 17> kInfos = {{
    {DType::kF64, "F64", 64, true},
    {DType::kF32, "F32", 32, true},
    {DType::kF16, "F16", 16, true},
    {DType::kBF16, "BF16", 16, true},
    {DType::kF8E4M3, "F8_E4M3", 8, true},
    {DType::kF8E5M2, "F8_E5M2", 8, true},
    {DType::kF8E8M0, "F8_E8M0", 8, true},
    {DType::kF4, "F4", 4, true},
    {DType::kU8, "U8", 8, false},
    {DType::kI8, "I8", 8, false},
    {DType::kU16, "U16", 16, false},
    {DType::kI16, "I16", 16, false},
    {DType::kU32, "U32", 32, false},
    {DType::kI32, "I32", 32, false},
    {DType::kU64, "U64", 64, false},
    {DType::kI64, "I64", 64, false},
    {DType::kBool, "BOOL", 8, false},
}};

const Info& info(DType dtype) {
  const auto index = static_cast<size_t>(dtype);
  KIMIRT_ASSERT(index < kInfos.size() && kInfos[index].dtype == dtype);
  return kInfos[index];
}

}  // namespace

std::string_view dtype_name(DType dtype) { return info(dtype).name; }
int dtype_bits(DType dtype) { return info(dtype).bits; }
bool dtype_is_float(DType dtype) { return info(dtype).is_float; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& i : kInfos) {
    if (i.name == name) return i.dtype;
  }
  return std::nullopt;
}

bool is_unsupported_safetensors_dtype(std::string_view name) {
  static constexpr std::string_view kOthers[] = {"F6_E2M3", "F6_E3M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "C64"};
  for (auto other : kOthers) {
    if (other == name) return true;
  }
  return false;
}

std::optional<uint64_t> dtype_bytes(DType dtype, uint64_t num_elements) {
  const uint64_t bits = static_cast<uint64_t>(dtype_bits(dtype));
  uint64_t total = 0;
  if (__builtin_mul_overflow(num_elements, bits, &total)) return std::nullopt;
  if (total % 8 != 0) return std::nullopt;
  return total / 8;
}

}  // namespace kimirt
