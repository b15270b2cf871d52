// Bit-exactness of the fp32 ↔ bf16/fp16 conversions against references built from first
// principles: every 16-bit value decoded in float64, and round-to-nearest-even by explicit
// comparison with the two neighbouring representable values.
#include "zero/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace zero {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// fp16 value of `h` computed in float64 from the IEEE definition.
double HalfValue(uint16_t h) {
  const int sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

// Nearest-even rounding of x among sorted non-negative candidates (bit patterns ascending),
// where the last candidate is Inf standing for "one step past the largest finite value".
uint16_t RoundAmong(double x, const std::vector<uint16_t>& patterns,
                    const std::vector<double>& values) {
  const double magnitude = std::fabs(x);
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (magnitude >= values.back()) return sign | patterns.back();  // beyond the overflow point
  auto upper = std::lower_bound(values.begin(), values.end(), magnitude);
  size_t hi = static_cast<size_t>(upper - values.begin());
  if (hi < values.size() && values[hi] == magnitude) return sign | patterns[hi];
  const size_t lo = hi - 1;
  const double down = magnitude - values[lo], up = values[hi] - magnitude;
  if (down < up) return sign | patterns[lo];
  if (up < down) return sign | patterns[hi];
  return sign | ((patterns[lo] & 1) ? patterns[hi] : patterns[lo]);
}

struct Table {
  std::vector<uint16_t> patterns;
  std::vector<double> values;
};

// All non-negative finite values of a 16-bit format plus the value one ulp past the maximum
// (the tie point for overflow), which rounds to Inf.
Table HalfTable() {
  Table t;
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    t.patterns.push_back(static_cast<uint16_t>(h));
    t.values.push_back(HalfValue(static_cast<uint16_t>(h)));
  }
  t.patterns.push_back(0x7c00);
  t.values.push_back(65536.0);  // 65504 + 32: the next value if the exponent range went on
  return t;
}

Table Bf16Table() {
  Table t;
  for (uint32_t b = 0; b < 0x7f80; ++b) {
    t.patterns.push_back(static_cast<uint16_t>(b));
    t.values.push_back(static_cast<double>(FromBits(b << 16)));
  }
  t.patterns.push_back(0x7f80);
  t.values.push_back(std::ldexp(1.0, 128));
  return t;
}

std::vector<uint32_t> FloatSamples() {
  std::vector<uint32_t> samples;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 9973) samples.push_back(static_cast<uint32_t>(u));
  // Ties and boundaries: exact halfway points, overflow edges, subnormal edges.
  for (float f : {65504.0f, 65519.996f, 65520.0f, 65536.0f, 5.9604645e-8f, 2.9802322e-8f,
                  2.9802326e-8f, 8.940697e-8f, 6.097555e-5f, 6.1035156e-5f, 1.0f, 1.0004883f,
                  1.0014648f, 3.4028235e38f, 1.1754944e-38f, 1e-45f}) {
    samples.push_back(ToBits(f));
    samples.push_back(ToBits(-f));
  }
  for (uint32_t low = 0; low < 0x20000; ++low) samples.push_back(0x3f800000u + low);  // [1, 1.03)
  return samples;
}

TEST(DType, SizesNamesAndParsing) {
  EXPECT_EQ(DTypeSize(DType::kFP32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFP16), 2u);
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("FP16"), DType::kFP16);
  EXPECT_EQ(*ParseDType("float32"), DType::kFP32);
  Status bad = ParseDType("fp8").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("fp8"), std::string::npos);
}

TEST(DType, IntegerTypesAreForCollectivesOnly) {
  EXPECT_EQ(DTypeSize(DType::kInt64), 8u);
  EXPECT_EQ(DTypeSize(DType::kUInt8), 1u);
  EXPECT_STREQ(DTypeName(DType::kInt64), "int64");
  EXPECT_STREQ(DTypeName(DType::kUInt8), "uint8");
  EXPECT_TRUE(IsFloatingPoint(DType::kBF16));
  EXPECT_FALSE(IsFloatingPoint(DType::kInt64));
  EXPECT_FALSE(IsFloatingPoint(DType::kUInt8));
  EXPECT_EQ(ParseDType("int64").status().code(), absl::StatusCode::kInvalidArgument);  // no param has it
}

TEST(DType, HalfToFloatIsExactForAll65536Values) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const double expected = HalfValue(static_cast<uint16_t>(h));
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0);
    } else {
      ASSERT_EQ(static_cast<double>(got), expected) << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
    }
  }
}

TEST(DType, Bf16ToFloatRoundTripsEveryNonNanPattern) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), b) << std::hex << b;
  }
}

TEST(DType, FloatToHalfRoundsToNearestEven) {
  const Table table = HalfTable();
  for (uint32_t bits : FloatSamples()) {
    const float f = FromBits(bits);
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(FloatToHalf(f), RoundAmong(f, table.patterns, table.values))
        << std::hex << "float bits 0x" << bits << " = " << f;
  }
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7bff);  // just under the overflow tie
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);    // the tie rounds to even: Inf
  EXPECT_EQ(FloatToHalf(2.9802322e-8f), 0x0000);  // 2^-25: tie between 0 and 2^-24 → 0
  EXPECT_EQ(FloatToHalf(8.940697e-8f), 0x0002);   // 1.5 · 2^-24: tie → even (2)
}

TEST(DType, FloatToBf16RoundsToNearestEven) {
  const Table table = Bf16Table();
  for (uint32_t bits : FloatSamples()) {
    const float f = FromBits(bits);
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(FloatToBf16(f), RoundAmong(f, table.patterns, table.values))
        << std::hex << "float bits 0x" << bits << " = " << f;
  }
}

TEST(DType, InfinityAndNanArePreserved) {
  for (float inf : {INFINITY, -INFINITY}) {
    EXPECT_EQ(FloatToHalf(inf), std::signbit(inf) ? 0xfc00 : 0x7c00);
    EXPECT_EQ(FloatToBf16(inf), std::signbit(inf) ? 0xff80 : 0x7f80);
    EXPECT_EQ(HalfToFloat(FloatToHalf(inf)), inf);
  }
  // Every NaN payload, signalling or quiet, either sign, stays NaN with its sign.
  for (uint32_t payload : {1u, 2u, 0x1fffu, 0x2000u, 0x3fffffu, 0x400000u, 0x7fffffu}) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float nan = FromBits(sign | 0x7f800000u | payload);
      ASSERT_TRUE(std::isnan(nan));
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(nan)))) << payload;
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(nan)))) << payload;
      EXPECT_EQ((FloatToHalf(nan) & 0x8000) != 0, sign != 0);
      EXPECT_EQ((FloatToBf16(nan) & 0x8000) != 0, sign != 0);
    }
  }
}

}  // namespace
}  // namespace zero
