// Fused Adam/AdamW, SGD, Lion and LAMB on CUDA: each optimizer is an element-wise operation
// run by the shared multi-tensor driver (elementwise.cuh), with the same arithmetic (fmaf where
// the CPU loops use MulAdd) as kernels/cpu.
#include <cub/block/block_reduce.cuh>

#include "absl/strings/str_cat.h"
#include "kernels/coefficients.h"
#include "kernels/launch_checks.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/optimizers_cuda.h"

namespace zero::kernels {
namespace cuda {
namespace {

__device__ inline bool Skipped(const int32_t* skip) { return skip != nullptr && *skip != 0; }

// Each op below takes the gradient scale read from device memory (StepCommon::grad_scale_at)
// through SetGradScale; LAMB's second pass reads no gradient.

struct AdamOp {
  __device__ void SetGradScale(float scale) { c.grad_scale = scale; }
  static constexpr bool kReadsAux = false, kWritesAux = false, kWritesWeights = true;
  AdamCoeffs c;
  __device__ void operator()(Element& e, float) const {
    float g = e.g * c.grad_scale;
    g = fmaf(e.w, c.l2_decay, g);
    const float w = e.w * c.decay_factor;
    e.m = fmaf(g - e.m, c.one_minus_beta1, e.m);
    e.v = fmaf(g * g, c.one_minus_beta2, e.v * c.beta2);
    const float denom = fmaf(sqrtf(e.v), c.inv_bc2_sqrt, c.eps);
    e.w = fmaf(e.m / denom, -c.step_size, w);
  }
};

struct SgdOp {
  __device__ void SetGradScale(float scale) { c.grad_scale = scale; }
  static constexpr bool kReadsAux = false, kWritesAux = false, kWritesWeights = true;
  SgdCoeffs c;
  __device__ void operator()(Element& e, float) const {
    float g = fmaf(e.w, c.weight_decay, e.g * c.grad_scale);
    if (c.momentum != 0.0f) {
      e.m = c.first_step ? g : fmaf(g, c.one_minus_dampening, e.m * c.momentum);
      g = c.nesterov ? fmaf(e.m, c.momentum, g) : e.m;
    }
    e.w = fmaf(g, -c.lr, e.w);
  }
};

struct LionOp {
  __device__ void SetGradScale(float scale) { c.grad_scale = scale; }
  static constexpr bool kReadsAux = false, kWritesAux = false, kWritesWeights = true;
  LionCoeffs c;
  __device__ void operator()(Element& e, float) const {
    const float g = e.g * c.grad_scale;
    const float x = fmaf(g, c.one_minus_beta1, e.m * c.beta1);
    const float direction = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
    e.w = fmaf(direction, -c.lr, e.w * c.decay_factor);
    e.m = fmaf(g, c.one_minus_beta2, e.m * c.beta2);
  }
};

// LAMB pass 1: the moments and the update direction u = m̂/(sqrt(v̂)+eps) + wd·p into aux.
struct LambUpdateOp {
  __device__ void SetGradScale(float scale) { c.grad_scale = scale; }
  static constexpr bool kReadsAux = false, kWritesAux = true, kWritesWeights = false;
  LambCoeffs c;
  __device__ void operator()(Element& e, float) const {
    const float g = e.g * c.grad_scale;
    e.m = fmaf(g - e.m, c.one_minus_beta1, e.m);
    e.v = fmaf(g * g, c.one_minus_beta2, e.v * c.beta2);
    const float denom = sqrtf(e.v * c.inv_bc2) + c.eps;
    e.aux = fmaf(e.w, c.weight_decay, (e.m * c.inv_bc1) / denom);
  }
};

// LAMB pass 2: p -= lr · trust_ratio · u, the segment's trust ratio in the scalar slot.
struct LambApplyOp {
  static constexpr bool kReadsAux = true, kWritesAux = false, kWritesWeights = true;
  float lr;
  __device__ void SetGradScale(float) {}
  __device__ void operator()(Element& e, float trust_ratio) const { e.w = fmaf(e.aux, -lr * trust_ratio, e.w); }
};

// One block per chunk: the op over the chunk and, with kSquares, the chunk's float64 sum of
// squared gradients into squares[blockIdx.x] (summed over the block in a fixed order).
template <typename P, typename G, bool kSquares, typename Op>
__global__ void __launch_bounds__(kThreads) ApplyKernel(LaunchTable t, Op op, const int32_t* skip,
                                                        const float* grad_scale_at, double* squares) {
  if (Skipped(skip)) return;
  if (grad_scale_at != nullptr) op.SetGradScale(*grad_scale_at);
  const double sum = ApplyToChunk<P, G, kSquares>(t, op);
  if constexpr (kSquares) {
    __shared__ typename cub::BlockReduce<double, kThreads>::TempStorage shared;
    const double total = cub::BlockReduce<double, kThreads>(shared).Sum(sum);
    if (threadIdx.x == 0) squares[blockIdx.x] = total;
  }
}

// Launches `op` over every segment: the body of every launcher below. With
// common.grad_squares, each launch's partials follow the previous launch's.
template <typename Op>
Status Launch(SegmentTypes types, absl::Span<const Segment> segments, absl::Span<float* const> aux,
              absl::Span<const float> scalars, const Op& op, const StepCommon& common, CudaStream stream) {
  if (common.grad_squares != nullptr && common.skip != nullptr) {
    return absl::InvalidArgumentError(
        "StepCommon: grad_squares with a skip flag (a skipped step would leave the partials unwritten)");
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  double* squares = common.grad_squares;
  return LaunchOverSegments(types, segments, aux, scalars, [&](auto p, auto g, const LaunchTable& t, int blocks) {
    if (squares == nullptr) {
      ApplyKernel<decltype(p), decltype(g), false, Op>
          <<<blocks, kThreads, 0, s>>>(t, op, common.skip, common.grad_scale_at, nullptr);
      return;
    }
    ApplyKernel<decltype(p), decltype(g), true, Op>
        <<<blocks, kThreads, 0, s>>>(t, op, common.skip, common.grad_scale_at, squares);
    squares += blocks;
  });
}

}  // namespace
}  // namespace cuda

Status AdamStepCuda(const AdamHyper& h, SegmentTypes types, absl::Span<const Segment> segments, CudaStream stream) {
  ZERO_RETURN_IF_ERROR(CheckAdam("AdamStepCuda", h, types, segments));
  return cuda::Launch(types, segments, {}, {}, cuda::AdamOp{MakeAdamCoeffs(h)}, h.common, stream);
}

Status SgdStepCuda(const SgdHyper& h, SegmentTypes types, absl::Span<const Segment> segments, CudaStream stream) {
  ZERO_RETURN_IF_ERROR(CheckSgd("SgdStepCuda", h, types, segments));
  return cuda::Launch(types, segments, {}, {}, cuda::SgdOp{MakeSgdCoeffs(h)}, h.common, stream);
}

Status LionStepCuda(const LionHyper& h, SegmentTypes types, absl::Span<const Segment> segments, CudaStream stream) {
  ZERO_RETURN_IF_ERROR(CheckLion("LionStepCuda", h, types, segments));
  return cuda::Launch(types, segments, {}, {}, cuda::LionOp{MakeLionCoeffs(h)}, h.common, stream);
}

Status LambUpdateCuda(const LambHyper& h, SegmentTypes types, absl::Span<const Segment> segments,
                      absl::Span<float* const> updates, CudaStream stream) {
  ZERO_RETURN_IF_ERROR(CheckLambUpdate("LambUpdateCuda", h, types, segments, updates));
  std::vector<Segment> reads(segments.begin(), segments.end());
  for (Segment& s : reads) s.model_param = nullptr;  // pass 1 writes no weights
  return cuda::Launch({DType::kFP32, types.grad}, reads, updates, {}, cuda::LambUpdateOp{MakeLambCoeffs(h)},
                      h.common, stream);
}

Status LambApplyCuda(const LambHyper& h, DType param_type, absl::Span<const Segment> segments,
                     absl::Span<const float* const> updates, absl::Span<const float> trust_ratios,
                     CudaStream stream) {
  ZERO_RETURN_IF_ERROR(CheckLambApply("LambApplyCuda", h, param_type, segments, updates, trust_ratios));
  if (h.common.grad_squares != nullptr) {
    return absl::InvalidArgumentError("LambApplyCuda: grad_squares set, but the second pass reads no gradient");
  }
  std::vector<Segment> weights(segments.begin(), segments.end());
  for (Segment& s : weights) s.grad = s.state0 = s.state1 = nullptr;  // pass 2 touches weights only
  // The driver's aux slots are float*; pass 2 only reads them (LambApplyOp::kWritesAux is false).
  std::vector<float*> aux;
  for (const float* u : updates) aux.push_back(const_cast<float*>(u));
  return cuda::Launch({param_type, DType::kFP32}, weights, aux, trust_ratios, cuda::LambApplyOp{h.lr},
                      h.common, stream);
}

}  // namespace zero::kernels
