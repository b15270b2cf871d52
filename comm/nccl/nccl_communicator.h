// The `nccl` backend: NCCL collectives on device buffers, one rank per GPU.
//
// Collectives run on a dedicated stream that first waits (through an event) for the work the
// trainer queued on its own stream before the call, so no device-wide synchronisation is
// needed. The ncclUniqueId travels over a bootstrap communicator (MPI in a batch job). NCCL
// and CUDA errors, including ncclCommGetAsyncError, become a Status.
#ifndef ZERO_COMM_NCCL_NCCL_COMMUNICATOR_H_
#define ZERO_COMM_NCCL_NCCL_COMMUNICATOR_H_

#include <memory>

#include "comm/communicator.h"

namespace zero::comm {

/// Options of the NCCL communicator.
struct NcclOptions {
  /// The cudaStream_t the trainer computes on (null: the legacy default stream). Each
  /// collective starts after the work queued there before the call.
  void* stream = nullptr;
  /// CUDA device of this rank; -1 keeps the current device.
  int device = -1;
};

/// Creates this rank's NCCL communicator over the same ranks as `bootstrap` (rank 0 makes the
/// ncclUniqueId and broadcasts it through `bootstrap`). kUnimplemented in builds without NCCL,
/// kUnavailable without a GPU.
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap,
                                                               NcclOptions options = {});

/// True when this build has the NCCL backend.
bool NcclAvailable();

}  // namespace zero::comm

#endif  // ZERO_COMM_NCCL_NCCL_COMMUNICATOR_H_
