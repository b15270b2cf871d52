// What the optimizer kernels operate on: a list of contiguous segments of a rank's shard, and
// the hyperparameters of each optimizer. Shared by the CPU and CUDA kernels.
//
// A rank's optimizer state is the concatenation of its shards (DESIGN.md), so a step sees a
// few long segments. Every kernel updates the fp32 weights in place and, for low-precision
// models, writes the rounded bf16/fp16 copy the trainer computes with.
#ifndef ZERO_KERNELS_SEGMENTS_H_
#define ZERO_KERNELS_SEGMENTS_H_

#include <cstdint>

#include "zero/dtype.h"

namespace zero::kernels {

/// One contiguous run of `numel` elements of a rank's shard. Pointers a kernel does not use
/// may be null; overlapping segments are not allowed.
struct Segment {
  float* master = nullptr;       ///< fp32 weights, updated in place (the params for fp32 models)
  void* model_param = nullptr;   ///< bf16/fp16 model copy written after the update, or null
  const void* grad = nullptr;    ///< gradient (SegmentTypes::grad)
  float* state0 = nullptr;       ///< exp_avg (Adam, LAMB, Lion) or momentum buffer (SGD)
  float* state1 = nullptr;       ///< exp_avg_sq (Adam, LAMB)
  int64_t numel = 0;
};

/// Element types of a segment list. `param` is the type of Segment::model_param: kFP32 means
/// the model is fp32 and `master` is the param itself (model_param must be null).
struct SegmentTypes {
  DType param = DType::kFP32;
  DType grad = DType::kFP32;
};

/// Fields common to every optimizer step.
struct StepCommon {
  /// Multiplies every gradient before use: 1 / loss_scale × clip coefficient.
  float grad_scale = 1.0f;
  /// When non-null and *skip != 0, the step modifies nothing (overflow detected).
  const int32_t* skip = nullptr;
  /// When non-null, the gradient scale is read from here as the kernel runs (device memory for
  /// the CUDA kernels, host memory for the CPU ones) instead of `grad_scale`: a clip
  /// coefficient decided on the device reaches the step without a round trip to the host.
  const float* grad_scale_at = nullptr;
  /// When non-null (CUDA kernels only; the CPU ones return kUnimplemented), the step also sums
  /// the squares of the gradients it reads, as stored (before grad_scale), in float64: one
  /// partial per 8K-element chunk, LaunchBlocks(segments) of them in segment order, for
  /// SumPartialsCuda. The gradient norm then costs no pass of its own where nothing waits for
  /// it (no clipping, no overflow check). Not with `skip`: a skipped step writes nothing.
  double* grad_squares = nullptr;
};

/// Adam and AdamW exactly as PyTorch defines them: bias-corrected moments, eps added after the
/// square root; L2 decay added to the gradient (Adam) or decoupled p *= 1 - lr·wd (AdamW).
struct AdamHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  bool decoupled_weight_decay = true;  ///< true: AdamW
  int64_t step = 1;                    ///< 1-based count of steps taken, this one included
  StepCommon common;
};

/// SGD with momentum, dampening and Nesterov as torch.optim.SGD: the first step (step == 1)
/// initialises the momentum buffer with the gradient.
struct SgdHyper {
  float lr = 1e-2f, momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
  int64_t step = 1;
  StepCommon common;
};

/// Lion (Chen et al. 2023): p *= 1 - lr·wd; p -= lr·sign(β1·m + (1-β1)·g); m = β2·m + (1-β2)·g.
struct LionHyper {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.99f, weight_decay = 0.0f;
  StepCommon common;
};

/// LAMB (You et al. 2020) as NVIDIA's FusedLAMB: the Adam direction plus decoupled decay,
/// u = m̂ / (sqrt(v̂) + eps) + wd·p, then p -= lr · trust_ratio · u with the trust ratio
/// ‖p‖/‖u‖ per parameter (1 where either norm is 0).
struct LambHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-6f, weight_decay = 0.0f;
  bool bias_correction = true;
  int64_t step = 1;
  StepCommon common;
};

/// A read-only run of `numel` elements, for norms.
struct ConstSpan {
  const void* data = nullptr;
  int64_t numel = 0;
};

/// Result of a squared-norm pass: the sum of squares in float64, and whether any element was
/// Inf or NaN (then `sq_norm` is not finite either).
struct NormResult {
  double sq_norm = 0.0;
  bool nonfinite = false;
};

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_SEGMENTS_H_
