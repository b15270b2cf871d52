// Host elementwise reductions shared by the backends: sums and maxima of fp32, bf16 and fp16
// arrays, accumulating in fp32.
#ifndef ZERO_COMM_REDUCE_H_
#define ZERO_COMM_REDUCE_H_

#include <cstdint>

#include "zero/communicator.h"

namespace zero::comm {

/// out[i] = op over k of inputs[k][i], k = 0..num_inputs-1 in that order, accumulated in fp32
/// and rounded once to `dtype`. `out` may alias any input at the same positions.
void ReduceInto(void* out, const void* const* inputs, int num_inputs, int64_t count, DType dtype,
                ReduceOp op);

}  // namespace zero::comm

#endif  // ZERO_COMM_REDUCE_H_
