// Device names and CUDA device discovery.
#include "zero/device.h"

#include <string>

#include "absl/strings/str_cat.h"

#if ZERO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace zero {

const char* DeviceName(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

StatusOr<Device> ParseDevice(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device \"", std::string(name), "\"; expected \"cpu\" or \"cuda\""));
}

int CudaDeviceCount() {
#if ZERO_HAVE_CUDA
  // Counted once: the CUDA runtime fixes the visible devices at its first call, and
  // PlacementOf asks for every pointer it is given.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver" error
      return 0;
    }
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

Placement PlacementOf(const void* pointer) {
#if ZERO_HAVE_CUDA
  if (pointer == nullptr || CudaDeviceCount() == 0) return Placement::kHost;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();
    return Placement::kHost;
  }
  if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) {
    return Placement::kDevice;
  }
  return attributes.type == cudaMemoryTypeHost ? Placement::kPinnedHost : Placement::kHost;
#else
  (void)pointer;
  return Placement::kHost;
#endif
}

}  // namespace zero
