// The vectorised bf16/fp16 stores of every instruction set against the exact scalar
// conversions of zero/dtype.h, over random bit patterns and every special class (subnormals,
// overflow to Inf, ties, Inf, NaN). LAMB's apply pass with a zero update is an identity on the
// fp32 weights, so the low-precision copy it writes is exactly the conversion under test.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

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

}  // namespace
}  // namespace zero::kernels
