// The `mpi` backend: OpenMPI non-blocking collectives on host buffers.
//
// One progress thread per communicator owns every MPI request: it launches collectives in
// submission order (so all ranks issue them in the same order), drives them with MPI_Test so
// they progress while the trainer computes, and completes the Works. bf16/fp16 sums and maxima
// use user MPI_Ops that combine in fp32. With `check_signatures`, every collective is preceded
// by a small all-gather of its signature, so ranks that diverge get kInvalidArgument naming
// both sides instead of corrupted memory or a hang. CUDA device buffers are answered with
// kUnimplemented for now.
//
// MPI is initialised (MPI_THREAD_MULTIPLE requested) if the host program has not done so, and
// then finalised at process exit; a program that initialised MPI itself keeps that duty.
#ifndef ZERO_COMM_MPI_MPI_COMMUNICATOR_H_
#define ZERO_COMM_MPI_MPI_COMMUNICATOR_H_

#include <memory>

#include "comm/communicator.h"

namespace zero::comm {

/// Options of the MPI communicator.
struct MpiOptions {
  /// Agree on each collective's signature before running it (one extra small all-gather).
  bool check_signatures = false;
};

/// Creates a communicator over a duplicate of `*mpi_comm` (an MPI_Comm*; null means
/// MPI_COMM_WORLD). Errors from MPI become kInternal with the MPI message.
StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(const void* mpi_comm,
                                                              MpiOptions options = {});

/// True when this build has the MPI backend.
bool MpiAvailable();

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_MPI_COMMUNICATOR_H_
