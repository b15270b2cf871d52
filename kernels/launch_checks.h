// Argument checks shared by the CPU and CUDA kernel launchers (internal to kernels).
#ifndef ZERO_KERNELS_LAUNCH_CHECKS_H_
#define ZERO_KERNELS_LAUNCH_CHECKS_H_

#include "absl/types/span.h"
#include "kernels/segments.h"
#include "zero/status.h"

namespace zero::kernels {

/// Which optional arrays a kernel reads or writes.
struct SegmentNeeds {
  bool grad = true;
  bool state0 = false;
  bool state1 = false;
};

/// Every segment has a non-negative size and the pointers `needs` and `types` call for;
/// a model_param is present exactly when types.param is bf16/fp16.
Status CheckSegments(const char* kernel, SegmentTypes types, absl::Span<const Segment> segments,
                     SegmentNeeds needs);

/// `value` is finite and within [low, high] (or [low, high) when `high_open`).
Status CheckRange(const char* kernel, const char* name, double value, double low, double high,
                  bool high_open = false);

/// step ≥ 1 (the 1-based count including this step).
Status CheckStep(const char* kernel, int64_t step);
/// Adam/AdamW: segments with master, grad and both moments; lr, betas, eps, weight decay,
/// step and grad_scale in range.
Status CheckAdam(const char* kernel, const AdamHyper& hyper, SegmentTypes types,
                 absl::Span<const Segment> segments);
/// SGD: the momentum buffer when momentum ≠ 0; Nesterov only with momentum and no dampening.
Status CheckSgd(const char* kernel, const SgdHyper& hyper, SegmentTypes types,
                absl::Span<const Segment> segments);
/// Lion: segments with master, grad and exp_avg; hyperparameters in range.
Status CheckLion(const char* kernel, const LionHyper& hyper, SegmentTypes types,
                 absl::Span<const Segment> segments);
/// LAMB's first pass: segments with master, grad and both moments, hyperparameters in range,
/// one non-null update buffer per non-empty segment.
Status CheckLambUpdate(const char* kernel, const LambHyper& hyper, SegmentTypes types,
                       absl::Span<const Segment> segments, absl::Span<float* const> updates);
/// LAMB's second pass: one update buffer and one finite, non-negative trust ratio per segment.
Status CheckLambApply(const char* kernel, const LambHyper& hyper, DType param_type,
                      absl::Span<const Segment> segments, absl::Span<const float* const> updates,
                      absl::Span<const float> trust_ratios);
/// grad_scale is finite.
Status CheckCommon(const char* kernel, const StepCommon& common);

/// True when the caller's overflow flag says to leave everything untouched.
inline bool Skipped(const StepCommon& common) {
  return common.skip != nullptr && *common.skip != 0;
}

/// `hyper` with its grad_scale read from common.grad_scale_at where that is set: what the CPU
/// launchers run with (the pointer is host memory there).
template <typename Hyper>
Hyper WithHostGradScale(Hyper hyper) {
  if (hyper.common.grad_scale_at != nullptr) hyper.common.grad_scale = *hyper.common.grad_scale_at;
  return hyper;
}

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_LAUNCH_CHECKS_H_
