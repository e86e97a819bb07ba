// Element types, spelled as safetensors spells them. Packed FP4 (E2M1) stores two elements per byte,
// element 2i in the low nibble.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kimirt {

enum class DType : uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // float8_e4m3fn: no infinities, 0x7F/0xFF are NaN, max 448
  kF8E5M2,  // IEEE-like: infinities and NaNs, max 57344
  kF8E8M0,  // unsigned exponent 2^(x-127), 0xFF is NaN (MX block scale)
  kF4,      // E2M1, packed two per byte, low nibble first
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kU64,
  kI64,
  kBool,
};

inline constexpr DType kAllDTypes[] = {
    DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2,
    DType::kF8E8M0, DType::kF4, DType::kU8, DType::kI8, DType::kU16, DType::kI16,
    DType::kU32, DType::kI32, DType::kU64, DType::kI64, DType::kBool};

// "F32", "BF16", "F8_E4M3", "F4", ... (safetensors spelling).
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; nullopt for a string kimirt does not know.
std::optional<DType> parse_dtype(std::string_view name);
// True for dtype strings the safetensors format defines but kimirt does not load (C64, F6_E2M3, ...),
// so that an error can say "unsupported" rather than "unknown".
bool is_unsupported_safetensors_dtype(std::string_view name);

int dtype_bits(DType dtype);
bool dtype_is_float(DType dtype);

// Bytes that n elements occupy; nullopt when the bit count overflows or is not a whole number of
// bytes (an odd count of packed FP4 elements).
std::optional<uint64_t> dtype_bytes(DType dtype, uint64_t num_elements);

}  // namespace kimirt
