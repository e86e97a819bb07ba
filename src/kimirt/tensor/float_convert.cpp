#include "kimirt/tensor/float_convert.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "kimirt/base/error.h"

namespace kimirt {
namespace {

// A narrow binary float format: sign bit (optional), ebits exponent bits, mbits mantissa bits.
struct Format {
  int ebits;
  int mbits;
  int bias;
  enum class Top { kIeee, kFn, kNone } top;  // all-ones exponent: Inf/NaN; only S.1111.111 is NaN; ordinary
  double max_finite;
};

constexpr Format kE4M3{4, 3, 7, Format::Top::kFn, 448.0};
constexpr Format kE5M2{5, 2, 15, Format::Top::kIeee, 57344.0};
constexpr Format kE2M1{2, 1, 1, Format::Top::kNone, 6.0};

uint32_t max_code(const Format& f) {
  switch (f.top) {
    case Format::Top::kIeee: return ((((1u << f.ebits) - 2u) << f.mbits) | ((1u << f.mbits) - 1u));
    case Format::Top::kFn: return ((1u << (f.ebits + f.mbits)) - 2u);
    case Format::Top::kNone: return ((1u << (f.ebits + f.mbits)) - 1u);
  }
  return 0;
}

// Encodes the magnitude |x| (finite, already known not to be NaN) into exponent|mantissa bits.
// Returns false when the rounded value exceeds the largest finite value.
bool encode_magnitude(const Format& f, double a, uint32_t* bits) {
  if (a == 0.0) {
    *bits = 0;
    return true;
  }
  const int emin = 1 - f.bias;
  int e = std::ilogb(a);
  if (e < emin) e = emin;
  // a / 2^(e - mbits) is exact in double (a comes from an f32); nearbyint rounds half to even.
  const double n = std::nearbyint(std::ldexp(a, f.mbits - e));
  const double value = std::ldexp(n, e - f.mbits);
  if (value > f.max_finite) return false;
  if (value == 0.0) {
    *bits = 0;
    return true;
  }
  const int ve = std::ilogb(value);
  uint32_t exp_field;
  uint32_t mant;
  if (ve < emin) {
    exp_field = 0;
    mant = static_cast<uint32_t>(std::ldexp(value, f.mbits - emin));
  } else {
    exp_field = static_cast<uint32_t>(ve + f.bias);
    mant = static_cast<uint32_t>(std::ldexp(value, f.mbits - ve)) - (1u << f.mbits);
  }
  *bits = (exp_field << f.mbits) | mant;
  return true;
}

uint8_t encode8(const Format& f, float x, Overflow overflow) {
  const uint32_t u = f32_to_bits(x);
  const uint32_t sign = (u >> 31) << (f.ebits + f.mbits);
  const uint32_t all_exp = ((1u << f.ebits) - 1u) << f.mbits;
  if (std::isnan(x)) {
    switch (f.top) {
      case Format::Top::kIeee: {
        // Keep the top payload bits; never let the payload vanish into an Inf.
        uint32_t payload = (u & 0x7fffffu) >> (23 - f.mbits);
        if (payload == 0) payload = 1u << (f.mbits - 1);
        return static_cast<uint8_t>(sign | all_exp | payload);
      }
      case Format::Top::kFn: return static_cast<uint8_t>(sign | all_exp | ((1u << f.mbits) - 1u));
      case Format::Top::kNone: return static_cast<uint8_t>(max_code(f));
    }
  }
  uint32_t bits = 0;
  const bool finite = std::isfinite(x) && encode_magnitude(f, std::fabs(static_cast<double>(x)), &bits);
  if (finite) return static_cast<uint8_t>(sign | bits);
  if (overflow == Overflow::kSaturate || f.top == Format::Top::kNone) {
    return static_cast<uint8_t>(sign | max_code(f));
  }
  if (f.top == Format::Top::kIeee) return static_cast<uint8_t>(sign | all_exp);
  return static_cast<uint8_t>(sign | all_exp | ((1u << f.mbits) - 1u));  // fn: NaN
}

float decode(const Format& f, uint32_t code) {
  const uint32_t sign = (code >> (f.ebits + f.mbits)) & 1u;
  const uint32_t exp_field = (code >> f.mbits) & ((1u << f.ebits) - 1u);
  const uint32_t mant = code & ((1u << f.mbits) - 1u);
  const uint32_t all_ones_exp = (1u << f.ebits) - 1u;
  float value;
  if (f.top == Format::Top::kIeee && exp_field == all_ones_exp) {
    if (mant == 0) {
      value = std::numeric_limits<float>::infinity();
    } else {
      // Payload into the top f32 mantissa bits, so that encoding gives the same code back.
      value = bits_to_f32(0x7f800000u | (mant << (23 - f.mbits)));
    }
  } else if (f.top == Format::Top::kFn && exp_field == all_ones_exp && mant == ((1u << f.mbits) - 1u)) {
    value = bits_to_f32(0x7fc00000u);
  } else if (exp_field == 0) {
    value = static_cast<float>(std::ldexp(static_cast<double>(mant), 1 - f.bias - f.mbits));
  } else {
    value = static_cast<float>(
        std::ldexp(static_cast<double>(mant + (1u << f.mbits)), static_cast<int>(exp_field) - f.bias - f.mbits));
  }
  return sign ? -value : value;
}

template <typename Fn>
std::array<float, 256> make_table(Fn fn) {
  std::array<float, 256> table{};
  for (uint32_t c = 0; c < 256; ++c) table[c] = fn(c);
  return table;
}

const std::array<float, 256>& e4m3_table() {
  static const auto table = make_table([](uint32_t c) { return decode(kE4M3, c); });
  return table;
}
const std::array<float, 256>& e5m2_table() {
  static const auto table = make_table([](uint32_t c) { return decode(kE5M2, c); });
  return table;
}
const std::array<float, 256>& e8m0_table() {
  static const auto table = make_table([](uint32_t c) {
    return c == 0xFF ? bits_to_f32(0x7fc00000u) : static_cast<float>(std::ldexp(1.0, static_cast<int>(c) - 127));
  });
  return table;
}

constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

uint16_t f32_to_bf16(float f, Overflow overflow) {
  const uint16_t h = f32_to_bf16(f);
  if (overflow == Overflow::kSaturate && (h & 0x7fffu) == 0x7f80u) {
    return static_cast<uint16_t>((h & 0x8000u) | 0x7f7fu);
  }
  return h;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return bits_to_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  return bits_to_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t f32_to_f16(float f, Overflow overflow) {
  const uint32_t x = f32_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {
    uint32_t payload = (ax >> 13) & 0x3ffu;
    if (payload == 0) payload = 0x200u;
    return static_cast<uint16_t>(sign | 0x7c00u | payload);
  }
  if (ax >= 0x477ff000u) {  // |x| >= 65520 rounds past 65504
    return static_cast<uint16_t>(sign | (overflow == Overflow::kSaturate ? 0x7bffu : 0x7c00u));
  }
  if (ax >= 0x38800000u) {  // normal half: rebias, then round the 13 dropped bits to nearest even
    uint32_t r = ax - ((127u - 15u) << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (ax <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: the tie goes to even zero
  const uint32_t e = ax >> 23;
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // value / 2^-24 = m >> shift
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

float e4m3_to_f32(uint8_t code) { return e4m3_table()[code]; }
uint8_t f32_to_e4m3(float f, Overflow overflow) { return encode8(kE4M3, f, overflow); }
float e5m2_to_f32(uint8_t code) { return e5m2_table()[code]; }
uint8_t f32_to_e5m2(float f, Overflow overflow) { return encode8(kE5M2, f, overflow); }
float e8m0_to_f32(uint8_t code) { return e8m0_table()[code]; }

uint8_t f32_to_e8m0(float f) {
  const uint32_t u = f32_to_bits(f);
  uint32_t exponent = (u >> 23) & 0xffu;
  if (exponent == 0xffu) return 0xff;
  // Round on the dropped mantissa: guard bit set and (round or sticky or the implicit bit) rounds up.
  const bool guard = (u & 0x400000u) != 0;
  const bool round_or_sticky = (u & 0x3fffffu) != 0;
  const bool implicit_one = exponent > 0;
  if (guard && (round_or_sticky || implicit_one)) ++exponent;
  return static_cast<uint8_t>(exponent);
}

float e2m1_to_f32(uint8_t code) { return kE2M1Values[code & 0xfu]; }
uint8_t f32_to_e2m1(float f) { return static_cast<uint8_t>(encode8(kE2M1, f, Overflow::kSaturate) & 0xfu); }

double dtype_max_finite(DType dtype) {
  switch (dtype) {
    case DType::kF64: return std::numeric_limits<double>::max();
    case DType::kF32: return std::numeric_limits<float>::max();
    case DType::kF16: return 65504.0;
    case DType::kBF16: return static_cast<double>(bf16_to_f32(0x7f7f));
    case DType::kF8E4M3: return kE4M3.max_finite;
    case DType::kF8E5M2: return kE5M2.max_finite;
    case DType::kF8E8M0: return std::ldexp(1.0, 127);
    case DType::kF4: return kE2M1.max_finite;
    default: fail("dtype {} is not a float format", dtype_name(dtype));
  }
}

namespace {
template <typename T>
void ints_to_f32(const void* src, float* dst, int64_t n) {
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
}
}  // namespace

void convert_to_f32(DType src_dtype, const void* src, float* dst, int64_t n) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (src_dtype) {
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::kF64: {
      const auto* s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const auto& t = e4m3_table();
      for (int64_t i = 0; i < n; ++i) dst[i] = t[bytes[i]];
      return;
    }
    case DType::kF8E5M2: {
      const auto& t = e5m2_table();
      for (int64_t i = 0; i < n; ++i) dst[i] = t[bytes[i]];
      return;
    }
    case DType::kF8E8M0: {
      const auto& t = e8m0_table();
      for (int64_t i = 0; i < n; ++i) dst[i] = t[bytes[i]];
      return;
    }
    case DType::kF4: {
      KIMIRT_CHECK(n % 2 == 0, "packed F4 conversion needs an even element count, got {}", n);
      for (int64_t i = 0; i < n / 2; ++i) {
        dst[2 * i] = kE2M1Values[bytes[i] & 0xfu];
        dst[2 * i + 1] = kE2M1Values[bytes[i] >> 4];
      }
      return;
    }
    case DType::kU8: ints_to_f32<uint8_t>(src, dst, n); return;
    case DType::kBool: ints_to_f32<uint8_t>(src, dst, n); return;
    case DType::kI8: ints_to_f32<int8_t>(src, dst, n); return;
    case DType::kU16: ints_to_f32<uint16_t>(src, dst, n); return;
    case DType::kI16: ints_to_f32<int16_t>(src, dst, n); return;
    case DType::kU32: ints_to_f32<uint32_t>(src, dst, n); return;
    case DType::kI32: ints_to_f32<int32_t>(src, dst, n); return;
    case DType::kU64: ints_to_f32<uint64_t>(src, dst, n); return;
    case DType::kI64: ints_to_f32<int64_t>(src, dst, n); return;
  }
  fail("no conversion from {} to F32", dtype_name(src_dtype));
}

void convert_from_f32(DType dst_dtype, const float* src, void* dst, int64_t n, Overflow overflow) {
  auto* bytes = static_cast<uint8_t*>(dst);
  switch (dst_dtype) {
    case DType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::kF64: {
      auto* d = static_cast<double*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<double>(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i], overflow);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i], overflow);
      return;
    }
    case DType::kF8E4M3:
      for (int64_t i = 0; i < n; ++i) bytes[i] = f32_to_e4m3(src[i], overflow);
      return;
    case DType::kF8E5M2:
      for (int64_t i = 0; i < n; ++i) bytes[i] = f32_to_e5m2(src[i], overflow);
      return;
    case DType::kF8E8M0:
      for (int64_t i = 0; i < n; ++i) bytes[i] = f32_to_e8m0(src[i]);
      return;
    case DType::kF4:
      KIMIRT_CHECK(n % 2 == 0, "packed F4 conversion needs an even element count, got {}", n);
      for (int64_t i = 0; i < n / 2; ++i) {
        bytes[i] = static_cast<uint8_t>(f32_to_e2m1(src[2 * i]) | (f32_to_e2m1(src[2 * i + 1]) << 4));
      }
      return;
    default: break;
  }
  fail("no conversion from F32 to {}", dtype_name(dst_dtype));
}

}  // namespace kimirt
