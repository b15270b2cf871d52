// The NCCL backend in a build without CUDA/NCCL: a clear error instead of a missing symbol.
#include "zero/communicator.h"

namespace zero::comm {

bool NcclAvailable() { return false; }

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator&, NcclOptions) {
  return absl::UnimplementedError(
      "this build of ZeroRT has no NCCL backend: build with the CUDA toolkit and NCCL "
      "(/usr/local/cuda) and -DZERO_CUDA=AUTO or ON");
}

}  // namespace zero::comm
