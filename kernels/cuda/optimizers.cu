// Fused Adam/AdamW, SGD and Lion on CUDA: one block per 64K-element chunk, each thread a strided
// walk, the same arithmetic (fmaf where the CPU loops use MulAdd) as kernels/cpu.
#include "kernels/coefficients.h"
#include "kernels/cpu/launch_checks.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/optimizers_cuda.h"

namespace zero::kernels {
namespace cuda {
namespace {

__device__ inline bool Skipped(const int32_t* skip) { return skip != nullptr && *skip != 0; }

template <typename P, typename G>
__global__ void AdamKernel(Table t, cpu::AdamCoeffs c, const int32_t* skip) {
  if (Skipped(skip)) return;
  int64_t begin, end;
  const Segment& s = BlockSegment(t, &begin, &end);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float w = s.master[i];
    float g = Load(G{}, s.grad, i) * c.grad_scale;
    g = fmaf(w, c.l2_decay, g);
    w *= c.decay_factor;
    float m = s.state0[i];
    m = fmaf(g - m, c.one_minus_beta1, m);
    float v = s.state1[i];
    v = fmaf(g * g, c.one_minus_beta2, v * c.beta2);
    const float denom = fmaf(sqrtf(v), c.inv_bc2_sqrt, c.eps);
    w = fmaf(m / denom, -c.step_size, w);
    s.master[i] = w;
    Store(P{}, s.model_param, i, w);
    s.state0[i] = m;
    s.state1[i] = v;
  }
}

template <typename P, typename G>
__global__ void SgdKernel(Table t, cpu::SgdCoeffs c, const int32_t* skip) {
  if (Skipped(skip)) return;
  int64_t begin, end;
  const Segment& s = BlockSegment(t, &begin, &end);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float w = s.master[i];
    float g = fmaf(w, c.weight_decay, Load(G{}, s.grad, i) * c.grad_scale);
    if (c.momentum != 0.0f) {
      const float buffer = c.first_step ? g : fmaf(g, c.one_minus_dampening, s.state0[i] * c.momentum);
      s.state0[i] = buffer;
      g = c.nesterov ? fmaf(buffer, c.momentum, g) : buffer;
    }
    w = fmaf(g, -c.lr, w);
    s.master[i] = w;
    Store(P{}, s.model_param, i, w);
  }
}

template <typename P, typename G>
__global__ void LionKernel(Table t, cpu::LionCoeffs c, const int32_t* skip) {
  if (Skipped(skip)) return;
  int64_t begin, end;
  const Segment& s = BlockSegment(t, &begin, &end);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = Load(G{}, s.grad, i) * c.grad_scale;
    const float m = s.state0[i];
    const float x = fmaf(g, c.one_minus_beta1, m * c.beta1);
    const float direction = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
    const float w = fmaf(direction, -c.lr, s.master[i] * c.decay_factor);
    s.master[i] = w;
    Store(P{}, s.model_param, i, w);
    s.state0[i] = fmaf(g, c.one_minus_beta2, m * c.beta2);
  }
}

}  // namespace
}  // namespace cuda

using cpu::CheckCommon;
using cpu::CheckRange;
using cpu::CheckSegments;

Status AdamStepCuda(const AdamHyper& h, SegmentTypes types, absl::Span<const Segment> segments, CudaStream stream) {
  constexpr const char* kName = "AdamStepCuda";
  ZERO_RETURN_IF_ERROR(CheckSegments(kName, types, segments, {true, true, true}));
  ZERO_RETURN_IF_ERROR(CheckRange(kName, "beta1", h.beta1, 0, 1, true));
  ZERO_RETURN_IF_ERROR(CheckRange(kName, "beta2", h.beta2, 0, 1, true));
  ZERO_RETURN_IF_ERROR(CheckCommon(kName, h.common));
  if (h.step < 1) return absl::InvalidArgumentError("AdamStepCuda: step must be ≥ 1");
  const cpu::AdamCoeffs c = cpu::MakeAdamCoeffs(h);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return cuda::LaunchOverSegments(types, segments, [&](auto p, auto g, const cuda::Table& t, int blocks) {
    cuda::AdamKernel<decltype(p), decltype(g)><<<blocks, cuda::kThreads, 0, s>>>(t, c, h.common.skip);
  });
}

Status SgdStepCuda(const SgdHyper& h, SegmentTypes types, absl::Span<const Segment> segments, CudaStream stream) {
  constexpr const char* kName = "SgdStepCuda";
  ZERO_RETURN_IF_ERROR(CheckSegments(kName, types, segments, {true, h.momentum != 0.0f, false}));
  ZERO_RETURN_IF_ERROR(CheckCommon(kName, h.common));
  if (h.step < 1) return absl::InvalidArgumentError("SgdStepCuda: step must be ≥ 1");
  const cpu::SgdCoeffs c = cpu::MakeSgdCoeffs(h);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return cuda::LaunchOverSegments(types, segments, [&](auto p, auto g, const cuda::Table& t, int blocks) {
    cuda::SgdKernel<decltype(p), decltype(g)><<<blocks, cuda::kThreads, 0, s>>>(t, c, h.common.skip);
  });
}

Status LionStepCuda(const LionHyper& h, SegmentTypes types, absl::Span<const Segment> segments, CudaStream stream) {
  constexpr const char* kName = "LionStepCuda";
  ZERO_RETURN_IF_ERROR(CheckSegments(kName, types, segments, {true, true, false}));
  ZERO_RETURN_IF_ERROR(CheckCommon(kName, h.common));
  const cpu::LionCoeffs c = cpu::MakeLionCoeffs(h);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return cuda::LaunchOverSegments(types, segments, [&](auto p, auto g, const cuda::Table& t, int blocks) {
    cuda::LionKernel<decltype(p), decltype(g)><<<blocks, cuda::kThreads, 0, s>>>(t, c, h.common.skip);
  });
}

}  // namespace zero::kernels
