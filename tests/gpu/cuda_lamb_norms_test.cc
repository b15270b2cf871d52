// The CUDA LAMB passes, Lion, per-span norms, misaligned (scalar-path) segments and the
// conversion kernels (also the widening add into fp32), against float64 references or the
// host conversions on fresh random inputs (label gpu: skips without a device). Outputs are
// poisoned before each run.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/optimizers.h"
#include "kernels/cuda/casts_cuda.h"
#include "kernels/cuda/optimizers_cuda.h"
#include "tests/gpu/device_test_util.h"
#include "tests/status_matchers.h"
#include "tests/unit/kernel_test_util.h"

namespace zero::kernels {
namespace {

using testing::AllTypeCombinations;
using testing::DeviceSegment;
using testing::HaveDevice;
using testing::IsOk;
using testing::OddSizes;
using testing::SegmentStorage;
using testing::ToDevice;
using testing::ToHost;

// Device sums of squares of `spans`: per span and in total, plus the Inf/NaN flag.
struct DeviceNorms {
  std::vector<double> per_span;
  double total = 0;
  int32_t nonfinite = -1;
};
DeviceNorms Norms(const std::vector<ConstSpan>& spans, DType dtype) {
  size_t bytes = 0;
  EXPECT_THAT(SquaredNormsCuda(nullptr, &bytes, spans, dtype, nullptr, nullptr, nullptr, nullptr), IsOk());
  void* workspace = nullptr;
  double *per_span = nullptr, *total = nullptr;
  int32_t* flag = nullptr;
  EXPECT_EQ(cudaMalloc(&workspace, bytes), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&per_span, (spans.size() + 1) * sizeof(double)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&total, sizeof(double)), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&flag, sizeof(int32_t)), cudaSuccess);
  EXPECT_EQ(cudaMemset(per_span, 0xff, (spans.size() + 1) * sizeof(double)), cudaSuccess);  // poison: NaN
  EXPECT_THAT(SquaredNormsCuda(workspace, &bytes, spans, dtype, per_span, total, flag, nullptr), IsOk());
  DeviceNorms out;
  out.per_span.resize(spans.size());
  ToHost(out.per_span, per_span);
  EXPECT_EQ(cudaMemcpy(&out.total, total, sizeof(double), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(&out.nonfinite, flag, sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(workspace); cudaFree(per_span); cudaFree(total); cudaFree(flag);
  return out;
}

TEST(CudaNorms, PerSpanSumsMatchFloat64AndRepeatBitForBit) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const std::vector<int64_t> sizes = {0, 1, 7, 65537, 1000003, 3};  // empty, ragged, several chunks
  for (DType dtype : {DType::kFP32, DType::kBF16, DType::kFP16}) {
    std::mt19937_64 rng(static_cast<int>(dtype) + 5);
    std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
    std::vector<std::vector<float>> values32(sizes.size());
    std::vector<std::vector<uint16_t>> values16(sizes.size());
    std::vector<void*> device(sizes.size(), nullptr);
    std::vector<ConstSpan> spans;
    std::vector<double> want(sizes.size(), 0.0);
    for (size_t k = 0; k < sizes.size(); ++k) {
      for (int64_t i = 0; i < sizes[k]; ++i) {
        float x = uniform(rng);
        if (dtype == DType::kFP32) {
          values32[k].push_back(x);
        } else {
          const uint16_t bits = testing::ToLowPrecision(x, dtype);
          values16[k].push_back(bits);
          x = dtype == DType::kBF16 ? Bf16ToFloat(bits) : HalfToFloat(bits);
        }
        want[k] += double{x} * x;
      }
      device[k] = dtype == DType::kFP32 ? static_cast<void*>(ToDevice(values32[k])) : ToDevice(values16[k]);
      spans.push_back({device[k], sizes[k]});
    }
    const DeviceNorms first = Norms(spans, dtype);
    double want_total = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      EXPECT_NEAR(first.per_span[k], want[k], 1e-12 * want[k]) << DTypeName(dtype) << " span " << k;
      want_total += want[k];
    }
    EXPECT_NEAR(first.total, want_total, 1e-12 * want_total);
    EXPECT_EQ(first.nonfinite, 0);
    const DeviceNorms again = Norms(spans, dtype);
    EXPECT_EQ(0, std::memcmp(first.per_span.data(), again.per_span.data(), sizes.size() * sizeof(double)));
    EXPECT_EQ(0, std::memcmp(&first.total, &again.total, sizeof(double)));
    for (void* p : device) cudaFree(p);
  }
}

TEST(CudaLamb, FullStepMatchesFloat64Reference) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  LambHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.01f;
  h.step = 2;
  h.common.grad_scale = 0.5f;
  for (SegmentTypes types : AllTypeCombinations()) {
    for (int64_t n : OddSizes()) {
      std::mt19937_64 rng(n + 7 * static_cast<int>(types.param) + static_cast<int>(types.grad));
      SegmentStorage got(n, types, rng);
      const SegmentStorage init = got;
      DeviceSegment device(got);
      const std::vector<Segment> segments = {device.View(n)};
      float* update = ToDevice(std::vector<float>(n, NAN));  // poisoned
      ASSERT_THAT(LambUpdateCuda(h, types, segments, {update}, nullptr), IsOk());
      const DeviceNorms w = Norms({{device.master, n}}, DType::kFP32);
      const DeviceNorms u = Norms({{update, n}}, DType::kFP32);
      const float ratio = LambTrustRatio(w.per_span[0], u.per_span[0]);
      ASSERT_THAT(LambApplyCuda(h, types.param, segments, {update}, {ratio}, nullptr), IsOk());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      device.Download(got);
      cudaFree(update);

      const testing::LambExpected want = testing::LambReference(h, init, types.grad);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got.master[i], want.weight[i], 2e-6 * std::fabs(want.weight[i]) + 5e-7) << i;
        ASSERT_NEAR(got.state0[i], want.m[i], 2e-6 * std::fabs(want.m[i]) + 5e-8) << i;
        ASSERT_NEAR(got.state1[i], want.v[i], 2e-6 * std::fabs(want.v[i]) + 1e-9) << i;
        if (types.param != DType::kFP32) {
          ASSERT_EQ(got.model_param[i], testing::ToLowPrecision(got.master[i], types.param));
        }
      }
    }
  }
}

TEST(CudaLion, MisalignedSegmentsTakeTheScalarPathAndMatchFloat64) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  LionHyper h;
  h.lr = 1e-3f;
  h.weight_decay = 0.1f;
  h.common.grad_scale = 0.25f;
  for (SegmentTypes types : AllTypeCombinations()) {
    for (int64_t offset : {0, 1}) {  // offset 1: no array is 16-byte aligned
      const int64_t n = 1000003;
      std::mt19937_64 rng(11 + offset + static_cast<int>(types.param));
      SegmentStorage got(n, types, rng);
      const SegmentStorage init = got;
      DeviceSegment device(got);
      ASSERT_THAT(LionStepCuda(h, types, {device.ViewAt(offset, n - offset, types.grad)}, nullptr), IsOk());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      device.Download(got);
      if (offset == 1) {
        ASSERT_EQ(got.master[0], init.master[0]) << "element before the segment changed";
      }
      for (int64_t i = offset; i < n; ++i) {
        const double g = init.Grad(i, types.grad) * double{h.common.grad_scale};
        const double c = h.beta1 * init.state0[i] + (1.0 - h.beta1) * g;
        if (std::fabs(c) <= 1e-6) continue;  // fp32 and fp64 may disagree on a near-zero's sign
        const double w = init.master[i] * (1.0 - double{h.lr} * h.weight_decay) - h.lr * ((c > 0) - (c < 0));
        const double m = h.beta2 * init.state0[i] + (1.0 - h.beta2) * g;
        ASSERT_NEAR(got.master[i], w, 2e-6 * std::fabs(w) + 5e-7) << i;
        ASSERT_NEAR(got.state0[i], m, 2e-6 * std::fabs(m) + 5e-8) << i;
        if (types.param != DType::kFP32) {
          ASSERT_EQ(got.model_param[i], testing::ToLowPrecision(got.master[i], types.param));
        }
      }
    }
  }
}

TEST(CudaCasts, WidenNarrowAndAddMatchTheHostConversionsBitForBit) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 100003;
  std::mt19937_64 rng(21);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  std::vector<float> values(n);
  for (float& x : values) x = normal(rng);
  values[0] = 65504.0f * 2;  // fp16 overflow: rounds to Inf
  values[1] = 1e-9f;         // fp16 subnormal range
  values[2] = -0.0f;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    auto narrow = [dtype](float x) { return testing::ToLowPrecision(x, dtype); };
    auto widen = [dtype](uint16_t b) { return dtype == DType::kBF16 ? Bf16ToFloat(b) : HalfToFloat(b); };
    float* source = ToDevice(values);
    uint16_t* low = ToDevice(std::vector<uint16_t>(n, 0xffff));  // poisoned
    ASSERT_THAT(NarrowFromFloatCuda(low, source, n, dtype, nullptr), IsOk());
    std::vector<uint16_t> got_low(n);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ToHost(got_low, low);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got_low[i], narrow(values[i])) << DTypeName(dtype) << " " << i;

    float* wide = ToDevice(std::vector<float>(n, NAN));
    ASSERT_THAT(WidenToFloatCuda(wide, low, n, dtype, nullptr), IsOk());
    std::vector<float> got_wide(n);
    ToHost(got_wide, wide);
    for (int64_t i = 0; i < n; ++i) {
      const float want = widen(got_low[i]);
      ASSERT_EQ(0, std::memcmp(&got_wide[i], &want, sizeof want)) << i;
    }

    std::vector<uint16_t> addend(n);
    for (int64_t i = 0; i < n; ++i) addend[i] = narrow(normal(rng));
    uint16_t* device_addend = ToDevice(addend);
    ASSERT_THAT(AddIntoCuda(low, device_addend, n, dtype, nullptr), IsOk());
    std::vector<uint16_t> sum(n);
    ToHost(sum, low);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(sum[i], narrow(widen(got_low[i]) + widen(addend[i]))) << i;
    }
    cudaFree(source); cudaFree(low); cudaFree(wide); cudaFree(device_addend);
  }
}

// AddIntoFloatCuda against float64 (the exact sum rounded to fp32 once, bit for bit) on fresh
// random accumulators and addends of every binade from 2^-20 to 2^15 and ±Inf: odd sizes, at a
// vector-aligned start (four elements per access) and a misaligned one (one by one); the
// accumulator is poisoned around the span, which must stay untouched.
TEST(CudaCasts, AddIntoFloatMatchesFloat64Reference) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kGuard = 5;
  std::mt19937_64 rng(23);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> binade(-20, 15);
  auto random_value = [&] { return static_cast<float>(std::ldexp(unit(rng), binade(rng))); };
  for (DType dtype : {DType::kFP32, DType::kBF16, DType::kFP16}) {
    for (int64_t n : OddSizes()) {
      for (int64_t offset : {0, 1}) {
        std::vector<float> accumulator(offset + n + kGuard, NAN), addend_fp32(offset + n);
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
        float* device_accumulator = ToDevice(accumulator);
        float* device_fp32 = ToDevice(addend_fp32);
        uint16_t* device_bits = ToDevice(addend_bits);
        const void* addend = dtype == DType::kFP32 ? static_cast<const void*>(device_fp32 + offset)
                                                   : static_cast<const void*>(device_bits + offset);
        ASSERT_THAT(AddIntoFloatCuda(device_accumulator + offset, addend, n, dtype, nullptr), IsOk());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ToHost(accumulator, device_accumulator);
        cudaFree(device_accumulator); cudaFree(device_fp32); cudaFree(device_bits);
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
