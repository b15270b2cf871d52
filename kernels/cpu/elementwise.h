// Host element-wise operations, shared by the communicators (their reductions) and the
// engine's CPU device ops: combine several arrays (sum or maximum: fp32, bf16 and fp16
// accumulated in fp32 and rounded once, int64 and uint8 exact), add one into another (also a
// bf16/fp16 one into an fp32 one), widen fp32/bf16/fp16 to fp32, narrow fp32 to them (the
// integer types, which no param has, are left untouched by Widen, Narrow and AddIntoFloat).
// The CUDA counterparts are in kernels/cuda/casts_cuda.h; both round to nearest even, once.
#ifndef ZERO_KERNELS_CPU_ELEMENTWISE_H_
#define ZERO_KERNELS_CPU_ELEMENTWISE_H_

#include <cstdint>

#include "zero/dtype.h"

namespace zero::kernels {

/// How ReduceInto combines its inputs.
enum class Combine : int { kSum, kMax };

/// out[i] = combine over k of inputs[k][i], k = 0..num_inputs-1 in that order, accumulated in
/// fp32 and rounded once to `dtype` (integers: exact, uint8 sums modulo 256). `out` may alias
/// any input at the same positions.
void ReduceInto(void* out, const void* const* inputs, int num_inputs, int64_t count, DType dtype,
                Combine combine);
/// accumulator[i] += addend[i] (ReduceInto with two inputs).
void AddIntoCpu(void* accumulator, const void* addend, int64_t numel, DType dtype);
/// accumulator[i] += float(addend[i]): an fp32 accumulator (a gradient kept in fp32) and an
/// fp32, bf16 or fp16 addend (a param-dtype gradient), widened exactly on the way; one fp32
/// rounding per element, no scratch memory. The arrays must not overlap.
void AddIntoFloatCpu(float* accumulator, const void* addend, int64_t numel, DType addend_dtype);
/// out[i] = in[i] as fp32 (exact).
void WidenCpu(float* out, const void* in, int64_t numel, DType dtype);
/// out[i] = in[i] rounded to `dtype` (nearest even).
void NarrowCpu(void* out, const float* in, int64_t numel, DType dtype);

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_CPU_ELEMENTWISE_H_
