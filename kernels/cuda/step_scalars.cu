// One-thread kernels for the step's scalars: tiny, but they keep the values on the device.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "base/status_converters.h"
#include "kernels/cuda/step_scalars_cuda.h"
#include "kernels/step_decision.h"

namespace zero::kernels {
namespace cuda {
namespace {

__global__ void SumToFloatKernel(const double* values, int count, float* out) {
  double sum = 0.0;
  for (int i = 0; i < count; ++i) sum += values[i];
  *out = static_cast<float>(sum);
}

__global__ void DecideClipKernel(const float* sq_norm, double divisor, float max_norm, float* grad_norm,
                                 float* grad_scale) {
  const ClipDecision decision = DecideClip(*sq_norm, divisor, max_norm);
  *grad_norm = decision.grad_norm;
  *grad_scale = decision.grad_scale;
}

}  // namespace
}  // namespace cuda

Status SumToFloatCuda(const double* values, int count, float* out, CudaStream stream) {
  if (out == nullptr || (count > 0 && values == nullptr) || count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("SumToFloatCuda: ", count, " values, null pointers"));
  }
  cuda::SumToFloatKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(values, count, out);
  ZERO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

Status DecideClipCuda(const float* sq_norm, double divisor, float max_norm, float* grad_norm,
                      float* grad_scale, CudaStream stream) {
  if (sq_norm == nullptr || grad_norm == nullptr || grad_scale == nullptr || !(divisor > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DecideClipCuda: null pointers or a divisor that is not positive (", divisor, ")"));
  }
  cuda::DecideClipKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(sq_norm, divisor, max_norm, grad_norm,
                                                                          grad_scale);
  ZERO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace zero::kernels
