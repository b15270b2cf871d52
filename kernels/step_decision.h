// The step's gradient scale from the global squared norm: one function the CPU and a CUDA
// kernel both call, so the decision is the same bits wherever it is taken. On a GPU it is taken
// on the device, and the optimizer kernels read its result there (StepCommon::grad_scale_at):
// clipping costs the host no wait.
#ifndef ZERO_KERNELS_STEP_DECISION_H_
#define ZERO_KERNELS_STEP_DECISION_H_

#include <cmath>

#ifdef __CUDACC__
#define ZERO_HOST_DEVICE __host__ __device__
#else
#define ZERO_HOST_DEVICE
#endif

namespace zero::kernels {

/// What a step does with its gradients.
struct ClipDecision {
  float grad_norm;   ///< global L2 norm of the averaged, unscaled gradient (before clipping)
  float grad_scale;  ///< what the optimizer multiplies each summed gradient by
};

/// From `sq_norm` (the sum of squares of the summed gradients over every rank; not finite when
/// any gradient was Inf/NaN), `divisor` (world size × loss scale) and `max_norm` (0: no
/// clipping): the norm of the averaged gradient, and 1/divisor times the clip coefficient
/// max_norm / (norm + 1e-6) when the norm exceeds max_norm (torch.nn.utils.clip_grad_norm_).
ZERO_HOST_DEVICE inline ClipDecision DecideClip(float sq_norm, double divisor, float max_norm) {
  const float grad_norm = static_cast<float>(sqrt(static_cast<double>(sq_norm)) / divisor);
  double clip = 1.0;
  if (max_norm > 0.0f && grad_norm > max_norm) clip = max_norm / (grad_norm + 1e-6);
  return {grad_norm, static_cast<float>(clip / divisor)};
}

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_STEP_DECISION_H_
