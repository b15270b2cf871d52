// The local backend's device path in a build without CUDA.
#include "comm/local/arrival.h"

namespace zero::comm {

Status ExecuteOnDevice(const Arrivals&) {
  return absl::UnimplementedError("CUDA device buffers need a build with CUDA (-DZERO_CUDA=AUTO or ON)");
}

}  // namespace zero::comm
