// Fused CPU optimizer steps over a rank's shard segments.
//
// Each call makes one pass over memory (LAMB: two, with norms between) and updates the fp32
// weights, the optimizer states and, for bf16/fp16 models, the low-precision copy. The
// overflow check and the clip decision are global across ranks, so they come first, from
// SquaredNorms (norms.h), and reach the step through StepCommon::grad_scale and ::skip.
//
// All launches validate their arguments and return kInvalidArgument naming the offending
// segment or hyperparameter; on error nothing has been modified.
#ifndef ZERO_KERNELS_CPU_OPTIMIZERS_H_
#define ZERO_KERNELS_CPU_OPTIMIZERS_H_

#include "absl/types/span.h"
#include "kernels/cpu/cpu_exec.h"
#include "kernels/segments.h"
#include "zero/status.h"

namespace zero::kernels {

/// Adam / AdamW step. Needs master, grad, state0 (exp_avg), state1 (exp_avg_sq).
Status AdamStepCpu(const AdamHyper& hyper, SegmentTypes types, absl::Span<const Segment> segments,
                   const CpuExec& exec);

/// SGD step. Needs master, grad, and state0 (momentum buffer) when momentum ≠ 0.
Status SgdStepCpu(const SgdHyper& hyper, SegmentTypes types, absl::Span<const Segment> segments,
                  const CpuExec& exec);

/// Lion step. Needs master, grad, state0 (exp_avg).
Status LionStepCpu(const LionHyper& hyper, SegmentTypes types, absl::Span<const Segment> segments,
                   const CpuExec& exec);

/// LAMB, first pass: updates exp_avg/exp_avg_sq and writes the update direction
/// u = m̂/(sqrt(v̂)+eps) + wd·p into `updates[i]` (segments[i].numel floats each). The weights
/// are not changed. The caller then takes per-parameter norms of the weights and of `updates`
/// (SquaredNorms), sums them across ranks, and calls LambApplyCpu.
Status LambUpdateCpu(const LambHyper& hyper, SegmentTypes types,
                     absl::Span<const Segment> segments, absl::Span<float* const> updates,
                     const CpuExec& exec);

/// LAMB, second pass: p -= lr · trust_ratios[i] · updates[i] for each segment, and the
/// low-precision copy. `hyper.common.skip` is honoured; grad_scale is not used here.
Status LambApplyCpu(const LambHyper& hyper, DType param_type, absl::Span<const Segment> segments,
                    absl::Span<const float* const> updates, absl::Span<const float> trust_ratios,
                    const CpuExec& exec);

/// LAMB's trust ratio from squared norms: ‖p‖/‖u‖, or 1 when either is 0.
float LambTrustRatio(double weight_sq_norm, double update_sq_norm);

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_CPU_OPTIMIZERS_H_
