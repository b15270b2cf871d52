// User MPI_Ops that sum or take the maximum of bf16/fp16 values in fp32 (internal to comm/mpi).
#ifndef ZERO_COMM_MPI_MPI_OPS_H_
#define ZERO_COMM_MPI_MPI_OPS_H_

#include <mpi.h>

#include "zero/communicator.h"

namespace zero::comm {

/// The four user operations of one communicator, created and freed with it.
class HalfPrecisionOps {
 public:
  /// Creates the operations. Errors are MPI errors.
  Status Create();
  /// Frees what Create made.
  void Free();
  /// The MPI_Op for `op` on 16-bit `dtype` (bf16 or fp16).
  MPI_Op Get(DType dtype, ReduceOp op) const;

 private:
  MPI_Op ops_[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};
};

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_MPI_OPS_H_
