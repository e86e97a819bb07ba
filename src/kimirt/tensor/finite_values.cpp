#include "kimirt/tensor/finite_values.h"

#include <algorithm>
#include <cstring>

namespace kimirt {
namespace {

// `bad(code)` for each little-endian element of T: first a branch-free count, which the compiler vectorizes (the
// common case, none, then runs at memory speed), and only when some are bad a second pass for the first.
template <typename T, typename Bad>
uint64_t count_codes(const uint8_t* data, uint64_t count, uint64_t* first, Bad bad) {
  const auto code = [&](uint64_t i) {
    T c;
    std::memcpy(&c, data + i * sizeof(T), sizeof(T));
    return c;
  };
  uint64_t n = 0;
  for (uint64_t i = 0; i < count; ++i) n += bad(code(i)) ? 1 : 0;
  if (n > 0 && first) {
    uint64_t i = 0;
    while (!bad(code(i))) ++i;
    *first = i;
  }
  return n;
}

}  // namespace

bool has_nonfinite_codes(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
      return true;
    default:
      return false;
  }
}

uint64_t count_nonfinite(DType dtype, const uint8_t* data, uint64_t count, uint64_t* first) {
  switch (dtype) {
    case DType::kF64:
      return count_codes<uint64_t>(data, count, first,
                                   [](uint64_t c) { return (c & 0x7FF0000000000000ull) == 0x7FF0000000000000ull; });
    case DType::kF32:
      return count_codes<uint32_t>(data, count, first, [](uint32_t c) { return (c & 0x7F800000u) == 0x7F800000u; });
    case DType::kF16:
      return count_codes<uint16_t>(data, count, first, [](uint16_t c) { return (c & 0x7C00u) == 0x7C00u; });
    case DType::kBF16:
      return count_codes<uint16_t>(data, count, first, [](uint16_t c) { return (c & 0x7F80u) == 0x7F80u; });
    case DType::kF8E4M3:
      return count_codes<uint8_t>(data, count, first, [](uint8_t c) { return (c & 0x7Fu) == 0x7Fu; });
    case DType::kF8E5M2:
      return count_codes<uint8_t>(data, count, first, [](uint8_t c) { return (c & 0x7Cu) == 0x7Cu; });
    case DType::kF8E8M0:
      return count_codes<uint8_t>(data, count, first, [](uint8_t c) { return c == 0xFFu; });
    default:
      return 0;
  }
}

NonfiniteCount::NonfiniteCount(DType dtype)
    : dtype_(dtype), pieces_(static_cast<uint64_t>(std::max(dtype_bits(dtype) / 8, 1))) {}

void NonfiniteCount::add(const uint8_t* data, uint64_t bytes) {
  pieces_.add(data, bytes, [this](const uint8_t* d, uint64_t n) { count(d, n); });
}

void NonfiniteCount::count(const uint8_t* data, uint64_t elements) {
  uint64_t at = 0;
  const uint64_t n = count_nonfinite(dtype_, data, elements, &at);
  if (n > 0 && nonfinite_ == 0) first_ = elements_ + at;
  nonfinite_ += n;
  elements_ += elements;
}

}  // namespace kimirt
