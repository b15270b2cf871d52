// The communicators' reductions of host buffers (internal to comm): kernels::ReduceInto with
// a collective's ReduceOp.
#ifndef ZERO_COMM_HOST_REDUCE_H_
#define ZERO_COMM_HOST_REDUCE_H_

#include <cstdint>

#include "kernels/cpu/elementwise.h"
#include "zero/communicator.h"

namespace zero::comm {

/// out[i] = op over k of inputs[k][i] (kernels::ReduceInto: fp32 accumulation, one rounding).
inline void ReduceInto(void* out, const void* const* inputs, int num_inputs, int64_t count, DType dtype,
                       ReduceOp op) {
  kernels::ReduceInto(out, inputs, num_inputs, count, dtype,
                      op == ReduceOp::kSum ? kernels::Combine::kSum : kernels::Combine::kMax);
}

}  // namespace zero::comm

#endif  // ZERO_COMM_HOST_REDUCE_H_
