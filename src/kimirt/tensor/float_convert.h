// Bit-exact conversions between f32 and the narrow float formats of checkpoints and kernels.
//
// f32 -> format rounds to nearest, ties to even (on the code's last mantissa bit). Overflow follows each
// format's own rule, with an opt-in saturating mode for quantizers:
//   BF16, F16, F8_E5M2: |x| that rounds past the largest finite value -> Inf (saturating: +-max).
//   F8_E4M3 (fn):       no Inf; what rounds past 448 (|x| > 464) and +-Inf -> NaN (saturating: +-448).
//   F4 (E2M1):          no Inf/NaN; always saturates to +-6; NaN -> +6 (as cvt.rn.satfinite does).
//   F8_E8M0:            2^(c-127), sign ignored; rounds up when the f32 mantissa is >= 1.5 (the linear
//                       midpoint, ties up, as PyTorch's float8_e8m0fnu cast); 0 -> 0x00; Inf/NaN -> 0xFF.
// NaN inputs stay NaN and keep their sign and as much payload as fits, so every code of every format
// round-trips through f32.
#pragma once

#include <bit>
#include <cstdint>

#include "kimirt/tensor/dtype.h"

namespace kimirt {

enum class Overflow { kNative, kSaturate };

inline float bits_to_f32(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t f32_to_bits(float f) { return std::bit_cast<uint32_t>(f); }

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    uint16_t h = static_cast<uint16_t>(u >> 16);
    // A payload only in the dropped bits would read back as Inf: set the quiet bit instead.
    return (h & 0x7fu) ? h : static_cast<uint16_t>(h | 0x40u);
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

uint16_t f32_to_bf16(float f, Overflow overflow);
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f, Overflow overflow = Overflow::kNative);
float e4m3_to_f32(uint8_t code);
uint8_t f32_to_e4m3(float f, Overflow overflow = Overflow::kNative);
float e5m2_to_f32(uint8_t code);
uint8_t f32_to_e5m2(float f, Overflow overflow = Overflow::kNative);
float e8m0_to_f32(uint8_t code);
uint8_t f32_to_e8m0(float f);
// E2M1 code in the low 4 bits (bit 3 = sign).
float e2m1_to_f32(uint8_t code);
uint8_t f32_to_e2m1(float f);

// Largest finite value of a float format (F4: 6, F8_E4M3: 448, ...).
double dtype_max_finite(DType dtype);

// Bulk conversions of n elements. src/dst point at packed storage for F4 (n must be even then).
// Integer and BOOL sources convert by value. Throws kimirt::Error for an unsupported pair.
void convert_to_f32(DType src_dtype, const void* src, float* dst, int64_t n);
void convert_from_f32(DType dst_dtype, const float* src, void* dst, int64_t n,
                      Overflow overflow = Overflow::kNative);

}  // namespace kimirt
