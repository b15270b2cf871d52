// The step's scalars on the device: the squared norms of several gradient lists summed and
// rounded once, and the clip decision (kernels/step_decision.h) taken where they lie, so a
// step queues its norm, clipping and update with no wait by the host. The stream is last.
#ifndef ZERO_KERNELS_CUDA_STEP_SCALARS_CUDA_H_
#define ZERO_KERNELS_CUDA_STEP_SCALARS_CUDA_H_

#include "kernels/cuda/optimizers_cuda.h"

namespace zero::kernels {

/// *out = float(values[0] + … + values[count-1]), summed in float64 in index order (device
/// pointers; one thread).
Status SumToFloatCuda(const double* values, int count, float* out, CudaStream stream);

/// From the device value *sq_norm, writes DecideClip(*sq_norm, divisor, max_norm) into
/// *grad_norm and *grad_scale (device pointers; one thread).
Status DecideClipCuda(const float* sq_norm, double divisor, float max_norm, float* grad_norm,
                      float* grad_scale, CudaStream stream);

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_CUDA_STEP_SCALARS_CUDA_H_
