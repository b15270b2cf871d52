// The MPI communicator's own reduction operations (internal to comm/mpi): bf16/fp16 sum and
// maximum computed in fp32, and a uint8 sum that wraps modulo 256. OpenMPI 4.1's vectorised
// MPI_SUM saturates 8-bit integers (128 + 128 gives 255, measured), where NCCL and the local
// communicator wrap.
#ifndef ZERO_COMM_MPI_MPI_OPS_H_
#define ZERO_COMM_MPI_MPI_OPS_H_

#include <mpi.h>

#include "zero/communicator.h"

namespace zero::comm {

/// The user operations of one communicator, created and freed with it.
class UserOps {
 public:
  /// Creates the operations. Errors are MPI errors.
  Status Create();
  /// Frees what Create made.
  void Free();
  /// The MPI_Op for `op` on `dtype`: ours for bf16, fp16 and the uint8 sum, MPI's built-in
  /// MPI_SUM or MPI_MAX otherwise.
  MPI_Op Get(DType dtype, ReduceOp op) const;

 private:
  MPI_Op half_[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};  // [bf16, fp16][sum, max]
  MPI_Op uint8_sum_ = MPI_OP_NULL;
};

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_MPI_OPS_H_
