// The vectorised bf16/fp16 stores of every instruction set against the exact scalar
// conversions of zero/dtype.h, over random bit patterns and every special class (subnormals,
// overflow to Inf, ties, Inf, NaN). LAMB's apply pass with a zero update is an identity on the
// fp32 weights, so the low-precision copy it writes is exactly the conversion under test. And
// the widening add of a bf16/fp16 gradient into an fp32 one against float64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/optimizers.h"
#include "tests/unit/kernel_test_util.h"
#include "zero/dtype.h"

namespace zero::kernels {
namespace {

std::vector<float> SpecialAndRandomFloats() {
  std::vector<float> values;
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  std::mt19937_64 rng(8);
  for (int i = 0; i < 200000; ++i) values.push_back(from_bits(static_cast<uint32_t>(rng())));
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.996f, 65520.0f, 1e9f, 5.9604645e-8f, 2.9802322e-8f,
                  8.940697e-8f, 6.1035156e-5f, 1.0009766f, 1.00390625f, 3.4028235e38f,
                  1.1754944e-38f, 1e-45f, INFINITY, NAN}) {
    values.push_back(f);
    values.push_back(-f);
  }
  for (uint32_t payload : {1u, 0x2000u, 0x400000u, 0x7fffffu}) {
    values.push_back(from_bits(0x7f800000u | payload));
    values.push_back(from_bits(0xff800000u | payload));
  }
  values.push_back(1.0f);  // leaves a ragged tail for every vector width
  return values;
}

TEST(CpuConversions, VectorStoresMatchExactScalarConversions) {
  const std::vector<float> values = SpecialAndRandomFloats();
  const int64_t n = static_cast<int64_t>(values.size());
  for (base::CpuIsa isa : testing::SupportedIsas()) {
    for (DType dtype : {DType::kBF16, DType::kFP16}) {
      std::vector<float> master = values;
      std::vector<float> zero_update(n, 0.0f);
      std::vector<uint16_t> out(n, 0xabcd);  // poisoned
      Segment segment;
      segment.master = master.data();
      segment.model_param = out.data();
      segment.numel = n;
      const std::vector<const float*> updates = {zero_update.data()};
      const std::vector<float> ratios = {1.0f};
      LambHyper h;
      h.lr = 1.0f;
      ASSERT_TRUE(LambApplyCpu(h, dtype, {segment}, updates, ratios, CpuExec{isa, 0}).ok());
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t want = testing::ToLowPrecision(values[i], dtype);
        ASSERT_EQ(out[i], want) << base::CpuIsaName(isa) << " " << DTypeName(dtype) << " value "
                                << values[i] << " at " << i;
      }
    }
  }
}

// AddIntoFloatCpu against float64: fresh random accumulators and addends (every binade from
// 2^-20 to 2^15, both signs, ±Inf), odd sizes at an aligned and a misaligned start. The answer
// is the exact sum rounded to fp32 once, bit for bit: the float64 sum rounded to fp32 is that
// (53 ≥ 2 × 24 + 2 bits, so rounding twice is innocuous). Elements around the span stay poisoned.
TEST(CpuAddIntoFloat, WidenedSumMatchesFloat64Reference) {
  constexpr int64_t kGuard = 5;
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> binade(-20, 15);
  auto random_value = [&] { return static_cast<float>(std::ldexp(unit(rng), binade(rng))); };
  for (DType dtype : {DType::kFP32, DType::kBF16, DType::kFP16}) {
    for (int64_t n : testing::OddSizes()) {
      for (int64_t offset : {0, 1}) {
        std::vector<float> accumulator(offset + n + kGuard, NAN);  // poisoned around the span
        std::vector<float> addend_fp32(offset + n);
        std::vector<uint16_t> addend_bits(offset + n);
        std::vector<double> want(n);
        for (int64_t i = 0; i < n; ++i) {
          accumulator[offset + i] = random_value();
          float add = i % 997 == 5 ? (i % 2 ? INFINITY : -INFINITY) : random_value();
          if (dtype != DType::kFP32) {
            addend_bits[offset + i] = testing::ToLowPrecision(add, dtype);
            add = dtype == DType::kBF16 ? Bf16ToFloat(addend_bits[offset + i]) : HalfToFloat(addend_bits[offset + i]);
          }
          addend_fp32[offset + i] = add;
          want[i] = double{accumulator[offset + i]} + double{add};
        }
        const void* addend = dtype == DType::kFP32 ? static_cast<const void*>(addend_fp32.data() + offset)
                                                   : static_cast<const void*>(addend_bits.data() + offset);
        AddIntoFloatCpu(accumulator.data() + offset, addend, n, dtype);
        for (int64_t i = 0; i < n; ++i) {
          const float expected = static_cast<float>(want[i]);
          ASSERT_EQ(0, std::memcmp(&accumulator[offset + i], &expected, 4))
              << DTypeName(dtype) << " n " << n << " offset " << offset << " at " << i << ": "
              << accumulator[offset + i] << " vs " << expected;
        }
        for (int64_t i = 0; i < offset; ++i) ASSERT_TRUE(std::isnan(accumulator[i])) << "before the span";
        for (int64_t i = 0; i < kGuard; ++i) ASSERT_TRUE(std::isnan(accumulator[offset + n + i])) << "past the end";
      }
    }
  }
}

}  // namespace
}  // namespace zero::kernels
