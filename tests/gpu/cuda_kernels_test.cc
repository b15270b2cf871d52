// The CUDA optimizer kernels against the float64 references on fresh random inputs (label gpu:
// skips without a device): every (param, grad) dtype combination, odd sizes, low-precision
// outputs poisoned before each run and checked bit-exactly against the host conversion of the
// fp32 result; the skip flag read on the device; deterministic norms.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cuda/optimizers_cuda.h"
#include "kernels/cuda/step_scalars_cuda.h"
#include "kernels/launch_table.h"
#include "kernels/step_decision.h"
#include "tests/gpu/device_test_util.h"
#include "tests/status_matchers.h"
#include "tests/unit/kernel_test_util.h"
#include "zero/device.h"

namespace zero::kernels {
namespace {

using testing::AllTypeCombinations;
using testing::DeviceSegment;
using testing::HaveDevice;
using testing::IsOk;
using testing::ToDevice;
using testing::OddSizes;
using testing::SegmentStorage;


TEST(CudaKernels, AdamWMatchesFloat64Reference) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  AdamHyper h;
  h.lr = 1e-2f;
  h.beta2 = 0.99f;
  h.weight_decay = 0.1f;
  h.step = 3;
  h.common.grad_scale = 0.5f;
  for (SegmentTypes types : AllTypeCombinations()) {
    for (int64_t n : OddSizes()) {
      std::mt19937_64 rng(n + static_cast<int>(types.param) * 3 + static_cast<int>(types.grad));
      SegmentStorage got(n, types, rng);
      const SegmentStorage init = got;
      DeviceSegment device(got);
      ASSERT_THAT(AdamStepCuda(h, types, {device.View(n)}, nullptr), IsOk());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      device.Download(got);
      for (int64_t i = 0; i < n; ++i) {
        double w = init.master[i], m = init.state0[i], v = init.state1[i];
        testing::AdamReference(h, w, m, v, init.Grad(i, types.grad));
        ASSERT_NEAR(got.master[i], w, 2e-6 * std::fabs(w) + 5e-7) << i;
        ASSERT_NEAR(got.state0[i], m, 2e-6 * std::fabs(m) + 5e-8) << i;
        ASSERT_NEAR(got.state1[i], v, 2e-6 * std::fabs(v) + 1e-9) << i;
        if (types.param != DType::kFP32) {
          ASSERT_EQ(got.model_param[i], testing::ToLowPrecision(got.master[i], types.param));
        }
      }
    }
  }
}

TEST(CudaKernels, SgdMatchesFloat64ReferenceAndSkipFlagStopsEverything) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  SgdHyper h;
  h.lr = 0.05f;
  h.momentum = 0.9f;
  h.dampening = 0.1f;
  h.weight_decay = 0.01f;
  h.step = 4;
  const SegmentTypes types{DType::kBF16, DType::kFP16};
  std::mt19937_64 rng(9);
  SegmentStorage got(1000003, types, rng);
  const SegmentStorage init = got;
  DeviceSegment device(got);
  int32_t* skip = nullptr;
  ASSERT_EQ(cudaMalloc(&skip, sizeof(int32_t)), cudaSuccess);
  const int32_t one = 1;
  ASSERT_EQ(cudaMemcpy(skip, &one, sizeof one, cudaMemcpyHostToDevice), cudaSuccess);
  SgdHyper skipped = h;
  skipped.common.skip = skip;
  ASSERT_THAT(SgdStepCuda(skipped, types, {device.View(got.master.size())}, nullptr), IsOk());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  device.Download(got);
  EXPECT_EQ(got.master, init.master);
  EXPECT_EQ(got.model_param, init.model_param);
  ASSERT_THAT(SgdStepCuda(h, types, {device.View(got.master.size())}, nullptr), IsOk());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  device.Download(got);
  for (size_t i = 0; i < got.master.size(); ++i) {
    double w = init.master[i], buf = init.state0[i];
    testing::SgdReference(h, w, buf, init.Grad(i, types.grad));
    ASSERT_NEAR(got.master[i], w, 2e-6 * std::fabs(w) + 5e-7) << i;
    ASSERT_NEAR(got.state0[i], buf, 2e-6 * std::fabs(buf) + 5e-8) << i;
  }
  cudaFree(skip);
}

// The gradient scale read on the device (StepCommon::grad_scale_at) gives the bits of the same
// scale passed by value, and the clip decision taken on the device those of the host's.
TEST(CudaKernels, GradScaleAtAndTheClipDecisionOnTheDeviceMatchTheHost) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const SegmentTypes types{DType::kBF16, DType::kFP32};
  std::mt19937_64 rng(13);
  const SegmentStorage init(100003, types, rng);
  // scalars: [sq_norm, grad_norm, grad_scale]
  float* scalars = nullptr;
  ASSERT_EQ(cudaMalloc(&scalars, 3 * sizeof(float)), cudaSuccess);
  const float sq_norm = 12345.678f;
  ASSERT_EQ(cudaMemcpy(scalars, &sq_norm, sizeof sq_norm, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_THAT(DecideClipCuda(scalars, 3.0, 1.5f, scalars + 1, scalars + 2, nullptr), IsOk());
  float got[3];
  ASSERT_EQ(cudaMemcpy(got, scalars, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
  const ClipDecision host = DecideClip(sq_norm, 3.0, 1.5f);
  EXPECT_EQ(got[1], host.grad_norm);
  EXPECT_EQ(got[2], host.grad_scale);
  auto run = [&](bool from_device) {
    SegmentStorage storage = init;
    DeviceSegment device(storage);
    AdamHyper h;
    h.common.grad_scale = from_device ? 7.0f : host.grad_scale;
    h.common.grad_scale_at = from_device ? scalars + 2 : nullptr;
    EXPECT_THAT(AdamStepCuda(h, types, {device.View(init.master.size())}, nullptr), IsOk());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    device.Download(storage);
    return storage;
  };
  const SegmentStorage by_value = run(false), from_device = run(true);
  EXPECT_EQ(from_device.master, by_value.master);
  EXPECT_EQ(from_device.state1, by_value.state1);
  EXPECT_NE(from_device.master, init.master);
  cudaFree(scalars);
}

TEST(CudaKernels, SquaredNormIsExactEnoughAndDeterministic) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> a(3000017), b(777);
  double want = 0;
  for (float& x : a) { x = normal(rng); want += double(x) * x; }
  for (float& x : b) { x = normal(rng); want += double(x) * x; }
  float* da = ToDevice(a);
  float* db = ToDevice(b);
  const std::vector<ConstSpan> spans = {{da, static_cast<int64_t>(a.size())}, {db, static_cast<int64_t>(b.size())}};
  size_t bytes = 0;
  ASSERT_THAT(SquaredNormsCuda(nullptr, &bytes, spans, DType::kFP32, nullptr, nullptr, nullptr, nullptr), IsOk());
  void* workspace = nullptr;
  double* total = nullptr;
  int32_t* nonfinite = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&total, sizeof(double)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&nonfinite, sizeof(int32_t)), cudaSuccess);
  double first = 0;
  for (int run = 0; run < 3; ++run) {
    ASSERT_THAT(SquaredNormsCuda(workspace, &bytes, spans, DType::kFP32, nullptr, total, nonfinite, nullptr), IsOk());
    double got = 0;
    int32_t flag = -1;
    ASSERT_EQ(cudaMemcpy(&got, total, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(&flag, nonfinite, sizeof flag, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_NEAR(got, want, 1e-12 * want);
    EXPECT_EQ(flag, 0);
    if (run == 0) first = got; else EXPECT_EQ(0, std::memcmp(&first, &got, sizeof got));
  }
  const float inf = INFINITY;
  ASSERT_EQ(cudaMemcpy(db + 776, &inf, sizeof inf, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_THAT(SquaredNormsCuda(workspace, &bytes, spans, DType::kFP32, nullptr, total, nonfinite, nullptr), IsOk());
  int32_t flag = 0;
  ASSERT_EQ(cudaMemcpy(&flag, nonfinite, sizeof flag, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(flag, 1);
  cudaFree(da); cudaFree(db); cudaFree(workspace); cudaFree(total); cudaFree(nonfinite);
}

// Segments of varied, odd lengths cut from one array of `total` elements (unaligned starts
// included), more than one launch table holds, with an empty one among them.
std::vector<Segment> CutSegments(const DeviceSegment& device, int64_t total, DType grad_type) {
  std::vector<Segment> segments;
  int64_t at = 0;
  for (int k = 0; at < total; ++k) {
    const int64_t numel = k == 5 ? 0 : std::min<int64_t>(total - at, (k * 7919) % 20011 + 1);
    segments.push_back(device.ViewAt(at, numel, grad_type));
    at += numel;
  }
  return segments;
}

TEST(CudaKernels, AStepSumsTheSquaresOfTheGradientsItReads) {
  // With StepCommon::grad_squares every optimizer writes one float64 partial per block, and
  // SumPartialsCuda rounds their sum once: the float64 reference's sum of squares of the
  // gradients as stored. The partials and the result are poisoned first, and the step itself
  // is bit-identical to one without squares.
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kTotal = 300007, kMostPartials = kTotal / kChunkElems + 64;
  double* partials = nullptr;
  float* sum = nullptr;
  ASSERT_EQ(cudaMalloc(&partials, kMostPartials * sizeof(double)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&sum, sizeof(float)), cudaSuccess);
  for (SegmentTypes types : AllTypeCombinations()) {
    for (const char* optimizer : {"adamw", "sgd", "lion"}) {
      SCOPED_TRACE(::testing::Message() << optimizer << " " << DTypeName(types.param) << "/" << DTypeName(types.grad));
      std::mt19937_64 rng(17 + static_cast<int>(types.param) * 3 + static_cast<int>(types.grad));
      SegmentStorage plain(kTotal, types, rng), squared = plain;
      const SegmentStorage init = plain;
      DeviceSegment plain_device(plain), squared_device(squared);
      const std::vector<Segment> plain_segments = CutSegments(plain_device, kTotal, types.grad);
      const std::vector<Segment> segments = CutSegments(squared_device, kTotal, types.grad);
      ASSERT_GT(segments.size(), static_cast<size_t>(kSegmentsPerLaunch));
      const int64_t blocks = LaunchBlocks(segments);
      ASSERT_LE(blocks, kMostPartials);
      ASSERT_EQ(cudaMemset(partials, 0xff, blocks * sizeof(double)), cudaSuccess);  // NaN
      ASSERT_EQ(cudaMemset(sum, 0xff, sizeof(float)), cudaSuccess);
      StepCommon common;
      common.grad_scale = 0.25f;
      StepCommon squares = common;
      squares.grad_squares = partials;
      auto step = [&](const StepCommon& c, const std::vector<Segment>& list) -> Status {
        if (optimizer[0] == 'a') {
          AdamHyper h;
          h.common = c;
          return AdamStepCuda(h, types, list, nullptr);
        }
        if (optimizer[0] == 's') {
          SgdHyper h;
          h.momentum = 0.9f;
          h.step = 2;
          h.common = c;
          return SgdStepCuda(h, types, list, nullptr);
        }
        LionHyper h;
        h.common = c;
        return LionStepCuda(h, types, list, nullptr);
      };
      ASSERT_THAT(step(common, plain_segments), IsOk());
      ASSERT_THAT(step(squares, segments), IsOk());
      ASSERT_THAT(SumPartialsCuda(partials, blocks, sum, nullptr), IsOk());
      float got = 0.0f;
      ASSERT_EQ(cudaMemcpy(&got, sum, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
      double want = 0.0;
      for (int64_t i = 0; i < kTotal; ++i) want += double(init.Grad(i, types.grad)) * init.Grad(i, types.grad);
      EXPECT_NEAR(got, want, 1e-6 * want);
      plain_device.Download(plain);
      squared_device.Download(squared);
      EXPECT_EQ(squared.master, plain.master);
      EXPECT_EQ(squared.state0, plain.state0);
      EXPECT_EQ(squared.state1, plain.state1);
      EXPECT_EQ(squared.model_param, plain.model_param);
    }
  }
  cudaFree(partials);
  cudaFree(sum);
}

TEST(CudaKernels, SquaresAreRefusedWithASkipFlagAndByLambsSecondPass) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(5);
  const SegmentTypes types{DType::kFP32, DType::kFP32};
  SegmentStorage host(100, types, rng);
  DeviceSegment device(host);
  double* partials = nullptr;
  int32_t* skip = nullptr;
  ASSERT_EQ(cudaMalloc(&partials, sizeof(double)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&skip, sizeof(int32_t)), cudaSuccess);
  AdamHyper adam;
  adam.common.grad_squares = partials;
  adam.common.skip = skip;
  EXPECT_THAT(AdamStepCuda(adam, types, {device.View(100)}, nullptr),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("skip")));
  LambHyper lamb;
  lamb.common.grad_squares = partials;
  const float* update = device.state0;
  const float ratio = 1.0f;
  EXPECT_THAT(LambApplyCuda(lamb, DType::kFP32, {device.View(100)}, {&update, 1}, {&ratio, 1}, nullptr),
              testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("reads no gradient")));
  cudaFree(partials);
  cudaFree(skip);
}

}  // namespace
}  // namespace zero::kernels
