// The MPI backend in a build without MPI: a clear error instead of a missing symbol.
#include "zero/communicator.h"

namespace zero::comm {

bool MpiAvailable() { return false; }

StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(const void*, MpiOptions) {
  return absl::UnimplementedError(
      "this build of ZeroRT has no MPI backend: install libopenmpi-dev and configure with "
      "-DZERO_MPI=AUTO or ON");
}

Status AbortMpiJob(int) {
  return absl::UnimplementedError("this build of ZeroRT has no MPI backend: there is no MPI job to end");
}

}  // namespace zero::comm
