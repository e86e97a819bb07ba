#include "kimirt/tensor/float_convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "kimirt/base/error.h"

namespace kimirt {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Every code of every 8-bit format decodes to a value that encodes back to the same code.
TEST(FloatConvert, E4M3EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 256; ++c) {
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}
TEST(FloatConvert, E5M2EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 256; ++c) {
    EXPECT_EQ(f32_to_e5m2(e5m2_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}
TEST(FloatConvert, E8M0EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 256; ++c) {
    EXPECT_EQ(f32_to_e8m0(e8m0_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}
TEST(FloatConvert, E2M1EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 16; ++c) {
    EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}
TEST(FloatConvert, BF16AndF16EveryCodeRoundTrips) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<uint16_t>(c);
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(h)), h) << "bf16 code " << c;
    ASSERT_EQ(f32_to_f16(f16_to_f32(h)), h) << "f16 code " << c;
  }
}

TEST(FloatConvert, E4M3Values) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
}

TEST(FloatConvert, E4M3RoundingAndOverflow) {
  // Ties go to the even code: 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39).
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3A);  // halfway 1.125 / 1.25 -> 1.25 (even)
  EXPECT_EQ(f32_to_e4m3(1.07f), 0x39);
  // Above 448: 464 is the tie between 448 (even) and the missing 480 -> 448; beyond it is NaN.
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(464.5f), 0x7F);
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-1e6f), 0xFF);
  EXPECT_EQ(f32_to_e4m3(kInf), 0x7F);
  EXPECT_EQ(f32_to_e4m3(1e6f, Overflow::kSaturate), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-kInf, Overflow::kSaturate), 0xFE);
  // Subnormal edge: 2^-10 is the tie between 0 and 2^-9 -> 0; just above goes to 2^-9.
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(kNaN), 0x7F);
}

TEST(FloatConvert, E5M2RoundingAndOverflow) {
  EXPECT_EQ(e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_f32(0x7C), kInf);
  EXPECT_EQ(f32_to_e5m2(61439.0f), 0x7B);  // below the 61440 midpoint
  EXPECT_EQ(f32_to_e5m2(61440.0f), 0x7C);  // tie to even -> Inf
  EXPECT_EQ(f32_to_e5m2(61440.0f, Overflow::kSaturate), 0x7B);
  EXPECT_EQ(f32_to_e5m2(-kInf), 0xFC);
  EXPECT_EQ(f32_to_e5m2(1.125f), 0x3C);  // tie between 1.0 (0x3C) and 1.25 (0x3D) -> even
  EXPECT_EQ(f32_to_e5m2(std::ldexp(1.0f, -16)), 0x01);  // smallest subnormal
}

TEST(FloatConvert, E8M0) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
  EXPECT_EQ(f32_to_e8m0(1.0f), 127);
  EXPECT_EQ(f32_to_e8m0(1.49f), 127);
  EXPECT_EQ(f32_to_e8m0(1.5f), 128);  // the linear midpoint rounds up
  EXPECT_EQ(f32_to_e8m0(0.75f), 127);
  EXPECT_EQ(f32_to_e8m0(-4.0f), 129);  // sign ignored
  EXPECT_EQ(f32_to_e8m0(0.0f), 0);
  EXPECT_EQ(f32_to_e8m0(kInf), 0xFF);
  EXPECT_EQ(f32_to_e8m0(kNaN), 0xFF);
  EXPECT_EQ(f32_to_e8m0(std::ldexp(1.75f, 127)), 0xFF);  // rounds past 2^127
}

TEST(FloatConvert, E2M1) {
  const float expected[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), expected[c]);
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c | 8)), -expected[c]);
  }
  // Midpoints round to the even code.
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);
  EXPECT_EQ(f32_to_e2m1(0.75f), 2);
  EXPECT_EQ(f32_to_e2m1(1.25f), 2);
  EXPECT_EQ(f32_to_e2m1(1.75f), 4);
  EXPECT_EQ(f32_to_e2m1(2.5f), 4);
  EXPECT_EQ(f32_to_e2m1(3.5f), 6);
  EXPECT_EQ(f32_to_e2m1(5.0f), 6);
  EXPECT_EQ(f32_to_e2m1(5.01f), 7);
  EXPECT_EQ(f32_to_e2m1(100.0f), 7);   // saturates
  EXPECT_EQ(f32_to_e2m1(-kInf), 15);
  EXPECT_EQ(f32_to_e2m1(kNaN), 7);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 8);    // -0
}

TEST(FloatConvert, BF16Rounding) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3F808000)), 0x3F80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3F818000)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3F808001)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x7F7FFFFF)), 0x7F80);  // rounds past max -> Inf
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x7F7FFFFF), Overflow::kSaturate), 0x7F7F);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x00000001)), 0x0000);  // tiny subnormal -> 0
  const uint16_t nan = f32_to_bf16(bits_to_f32(0x7F800001));  // payload only in the dropped bits
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
}

TEST(FloatConvert, F16RoundingAndOverflow) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(65520.0f, Overflow::kSaturate), 0x7BFF);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even zero
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 quanta: tie -> even (2)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
}

// The fast BF16/F16 paths agree with round-to-nearest-even computed in double on many random inputs.
TEST(FloatConvert, FastPathsMatchDoubleRounding) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = bits_to_f32(bits(rng));
    if (!std::isfinite(x)) continue;
    const float via_bf16 = bf16_to_f32(f32_to_bf16(x));
    const float via_f16 = f16_to_f32(f32_to_f16(x));
    // Neighbour check: the chosen value is at least as close as the codes on either side.
    for (int step : {-1, 1}) {
      const uint16_t b = static_cast<uint16_t>(f32_to_bf16(x) + step);
      const float nb = bf16_to_f32(b);
      if (std::isfinite(nb) && std::isfinite(via_bf16)) {
        ASSERT_LE(std::fabs(static_cast<double>(via_bf16) - x), std::fabs(static_cast<double>(nb) - x)) << x;
      }
      const uint16_t h = static_cast<uint16_t>(f32_to_f16(x) + step);
      const float nh = f16_to_f32(h);
      if (std::isfinite(nh) && std::isfinite(via_f16) && (f32_to_f16(x) & 0x7fff) != 0) {
        ASSERT_LE(std::fabs(static_cast<double>(via_f16) - x), std::fabs(static_cast<double>(nh) - x)) << x;
      }
    }
  }
}

TEST(FloatConvert, BulkPackedF4LowNibbleFirst) {
  const uint8_t packed[2] = {0x21, 0xF7};  // elements: 0x1, 0x2, 0x7, 0xF
  float out[4];
  convert_to_f32(DType::kF4, packed, out, 4);
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], 6.0f);
  EXPECT_EQ(out[3], -6.0f);
  uint8_t back[2];
  convert_from_f32(DType::kF4, out, back, 4);
  EXPECT_EQ(back[0], 0x21);
  EXPECT_EQ(back[1], 0xF7);
  EXPECT_THROW(convert_to_f32(DType::kF4, packed, out, 3), Error);
}

}  // namespace
}  // namespace kimirt
