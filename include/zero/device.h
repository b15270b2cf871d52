// Where a buffer lives: host memory, page-locked host memory, or CUDA device memory.
#ifndef ZERO_DEVICE_H_
#define ZERO_DEVICE_H_

#include <string_view>

#include "zero/status.h"

namespace zero {

/// The compute device an engine runs on (config key "device").
enum class Device : int { kCpu = 0, kCuda = 1 };

/// Where one allocation lives. kPinnedHost is page-locked host memory for staging device
/// buffers through host-only transports (MPI without CUDA awareness).
enum class Placement : int { kHost = 0, kPinnedHost = 1, kDevice = 2 };

/// "cpu" or "cuda".
const char* DeviceName(Device device);

/// Parses "cpu" or "cuda"; anything else is kInvalidArgument.
StatusOr<Device> ParseDevice(std::string_view name);

/// Number of CUDA devices visible to this process; 0 when the library was built without CUDA
/// or no driver/device is present (never an error: callers decide whether a GPU is required).
/// Counted at the first call, as the CUDA runtime fixes the visible devices then.
int CudaDeviceCount();

/// Where `pointer` points: kDevice or kPinnedHost for memory the CUDA runtime knows, kHost
/// otherwise (always kHost in a build without CUDA or on a machine without a GPU).
Placement PlacementOf(const void* pointer);

}  // namespace zero

#endif  // ZERO_DEVICE_H_
