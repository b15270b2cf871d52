// CreateCudaDeviceOps in a build without CUDA.
#include "runtime/device_ops.h"

namespace zero::runtime {

StatusOr<std::unique_ptr<DeviceOps>> CreateCudaDeviceOps(base::Allocator) {
  return absl::UnavailableError(
      "device \"cuda\": this ZeroRT was built without CUDA (configure with -DZERO_CUDA=ON where "
      "nvcc is installed); use \"device\": \"cpu\"");
}

}  // namespace zero::runtime
