// Element-wise conversions and sums on CUDA device memory that the engine needs besides the
// optimizer steps: fp32 master copies from bf16/fp16 params and back, adding one gradient
// buffer into another, and adding a param-dtype gradient into an fp32 one. The host
// counterparts are kernels/cpu/elementwise.h; the results are bit-identical to them (round to
// nearest even, one rounding).
#ifndef ZERO_KERNELS_CUDA_CASTS_CUDA_H_
#define ZERO_KERNELS_CUDA_CASTS_CUDA_H_

#include <cstdint>

#include "kernels/cuda/optimizers_cuda.h"
#include "zero/dtype.h"
#include "zero/status.h"

namespace zero::kernels {

/// out[i] = float(in[i]) for `numel` elements of `dtype` (device pointers).
Status WidenToFloatCuda(float* out, const void* in, int64_t numel, DType dtype, CudaStream stream);

/// out[i] = in[i] rounded to `dtype` (round to nearest even; a copy for fp32).
Status NarrowFromFloatCuda(void* out, const float* in, int64_t numel, DType dtype, CudaStream stream);

/// accumulator[i] = round(float(accumulator[i]) + float(addend[i])) in `dtype`.
Status AddIntoCuda(void* accumulator, const void* addend, int64_t numel, DType dtype, CudaStream stream);

/// accumulator[i] += float(addend[i]): an fp32 accumulator and an fp32, bf16 or fp16 addend
/// widened exactly on the way (no scratch memory); one fp32 rounding per element, as
/// AddIntoFloatCpu. The arrays must not overlap.
Status AddIntoFloatCuda(float* accumulator, const void* addend, int64_t numel, DType addend_dtype,
                        CudaStream stream);

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_CUDA_CASTS_CUDA_H_
