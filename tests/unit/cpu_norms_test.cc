// Squared norms on the CPU: float64 reference on fresh random data for every dtype, ISA and
// odd size; per-span results; Inf/NaN detection at any position; bit-identical results for any
// thread count; the two-phase workspace protocol.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/norms.h"
#include "tests/status_matchers.h"
#include "tests/unit/kernel_test_util.h"
#include "zero/dtype.h"

namespace zero::kernels {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::IsOk;
using testing::StatusIs;
using testing::SupportedIsas;
using testing::ToLowPrecision;

// Random data of one dtype, with its decoded float64 values.
struct Data {
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  std::vector<double> values;
  DType dtype;

  Data(int64_t n, DType dt, std::mt19937_64& rng) : dtype(dt) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float x = normal(rng);
      if (dt == DType::kFP32) {
        f32.push_back(x);
        values.push_back(x);
      } else {
        u16.push_back(ToLowPrecision(x, dt));
        values.push_back(dt == DType::kBF16 ? Bf16ToFloat(u16.back()) : HalfToFloat(u16.back()));
      }
    }
  }
  ConstSpan Span() const {
    return {dtype == DType::kFP32 ? static_cast<const void*>(f32.data()) : u16.data(),
            static_cast<int64_t>(values.size())};
  }
  void Set(int64_t i, float x) {
    if (dtype == DType::kFP32) f32[i] = x; else u16[i] = ToLowPrecision(x, dtype);
  }
};

StatusOr<NormResult> Norms(const std::vector<ConstSpan>& spans, DType dtype,
                           std::vector<double>* per_span, const CpuExec& exec) {
  size_t bytes = 0;
  ZERO_RETURN_IF_ERROR(SquaredNormsCpu(nullptr, &bytes, spans, dtype, {}, nullptr, exec));
  std::vector<char> workspace(bytes);
  NormResult total;
  total.sq_norm = NAN;  // poisoned
  per_span->assign(spans.size(), NAN);
  ZERO_RETURN_IF_ERROR(SquaredNormsCpu(workspace.data(), &bytes, spans, dtype,
                                       absl::MakeSpan(*per_span), &total, exec));
  return total;
}

TEST(CpuNorms, MatchFloat64ReferencePerSpanAndTotal) {
  for (base::CpuIsa isa : SupportedIsas()) {
    for (DType dtype : {DType::kFP32, DType::kBF16, DType::kFP16}) {
      std::mt19937_64 rng(11 + static_cast<int>(dtype));
      std::vector<Data> data;
      for (int64_t n : testing::OddSizes()) data.emplace_back(n, dtype, rng);
      data.emplace_back(0, dtype, rng);  // an empty span is allowed
      std::vector<ConstSpan> spans;
      for (const Data& d : data) spans.push_back(d.Span());
      std::vector<double> per_span;
      auto total = Norms(spans, dtype, &per_span, CpuExec{isa, 0});
      ASSERT_THAT(total, IsOk());
      double want_total = 0;
      for (size_t s = 0; s < data.size(); ++s) {
        double want = 0;
        for (double x : data[s].values) want += x * x;
        want_total += want;
        EXPECT_NEAR(per_span[s], want, 1e-12 * want) << base::CpuIsaName(isa) << " span " << s;
      }
      EXPECT_NEAR(total->sq_norm, want_total, 1e-12 * want_total);
      EXPECT_FALSE(total->nonfinite);
    }
  }
}

TEST(CpuNorms, DetectInfAndNanAnywhere) {
  for (base::CpuIsa isa : SupportedIsas()) {
    for (DType dtype : {DType::kFP32, DType::kBF16, DType::kFP16}) {
      // First element, a vector body, a chunk boundary, the ragged tail, the last element.
      for (int64_t position : {int64_t{0}, int64_t{40}, int64_t{16384}, int64_t{1000000},
                               int64_t{1000002}}) {
        for (float bad : {INFINITY, -INFINITY, NAN}) {
          std::mt19937_64 rng(position);
          Data d(1000003, dtype, rng);
          d.Set(position, bad);
          std::vector<double> per_span;
          auto total = Norms({d.Span()}, dtype, &per_span, CpuExec{isa, 0});
          ASSERT_THAT(total, IsOk());
          EXPECT_TRUE(total->nonfinite) << base::CpuIsaName(isa) << " " << DTypeName(dtype)
                                        << " at " << position << " value " << bad;
        }
      }
      // fp16 overflow of a large finite fp32 value is Inf in the gradient itself.
      if (dtype == DType::kFP16) {
        std::mt19937_64 rng(1);
        Data d(100, dtype, rng);
        d.Set(99, 70000.0f);
        std::vector<double> per_span;
        EXPECT_TRUE(Norms({d.Span()}, dtype, &per_span, CpuExec{isa, 0})->nonfinite);
      }
    }
  }
}

TEST(CpuNorms, BitIdenticalForAnyThreadCount) {
  std::mt19937_64 rng(2);
  Data a(3000017, DType::kFP32, rng), b(777, DType::kFP32, rng);
  for (base::CpuIsa isa : SupportedIsas()) {
    std::vector<double> first_spans;
    double first = 0;
    for (int threads : {1, 2, 3, 5, 8}) {
      std::vector<double> per_span;
      auto total = Norms({a.Span(), b.Span()}, DType::kFP32, &per_span, CpuExec{isa, threads});
      ASSERT_THAT(total, IsOk());
      if (threads == 1) {
        first = total->sq_norm;
        first_spans = per_span;
      } else {
        EXPECT_EQ(0, std::memcmp(&first, &total->sq_norm, sizeof first)) << threads;
        EXPECT_EQ(first_spans, per_span) << threads;
      }
    }
  }
}

TEST(CpuNorms, WorkspaceProtocolAndErrors) {
  std::mt19937_64 rng(4);
  Data d(40000, DType::kFP32, rng);
  size_t bytes = 0;
  ASSERT_THAT(SquaredNormsCpu(nullptr, &bytes, {d.Span()}, DType::kFP32, {}, nullptr, {}), IsOk());
  EXPECT_EQ(bytes, 3 * sizeof(double));  // 40000 elements = 3 chunks of 16384
  std::vector<char> small(bytes - 1);
  size_t small_bytes = small.size();
  NormResult total;
  EXPECT_THAT(SquaredNormsCpu(small.data(), &small_bytes, {d.Span()}, DType::kFP32, {}, &total, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("workspace")));
  const ConstSpan null_span = {nullptr, 5};
  EXPECT_THAT(SquaredNormsCpu(nullptr, &bytes, {null_span}, DType::kFP32, {}, nullptr, {}), Not(IsOk()));
}

}  // namespace
}  // namespace zero::kernels
