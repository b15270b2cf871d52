// Helpers for the CUDA kernel tests: host vectors mirrored in device memory, and whether a
// device is present (the gpu-labelled tests skip without one).
#ifndef ZERO_TESTS_GPU_DEVICE_TEST_UTIL_H_
#define ZERO_TESTS_GPU_DEVICE_TEST_UTIL_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "tests/unit/kernel_test_util.h"
#include "zero/device.h"

namespace zero::testing {

/// A device copy of `host` (null when empty); the caller frees it.
template <typename T>
T* ToDevice(const std::vector<T>& host) {
  if (host.empty()) return nullptr;
  T* device = nullptr;
  EXPECT_EQ(cudaMalloc(&device, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return device;
}
/// Copies device memory back into `host` (its size says how much).
template <typename T>
void ToHost(std::vector<T>& host, const T* device) {
  if (!host.empty()) {
    EXPECT_EQ(cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
}

/// A SegmentStorage mirrored on the device.
struct DeviceSegment {
  float *master, *state0, *state1;
  uint16_t* model_param;
  void* grad;
  explicit DeviceSegment(const SegmentStorage& h)
      : master(ToDevice(h.master)), state0(ToDevice(h.state0)), state1(ToDevice(h.state1)),
        model_param(ToDevice(h.model_param)),
        grad(h.grad32.empty() ? static_cast<void*>(ToDevice(h.grad16)) : ToDevice(h.grad32)) {}
  DeviceSegment(const DeviceSegment&) = delete;
  DeviceSegment& operator=(const DeviceSegment&) = delete;
  ~DeviceSegment() {
    cudaFree(master); cudaFree(state0); cudaFree(state1); cudaFree(model_param); cudaFree(grad);
  }
  Segment View(int64_t numel) const { return {master, model_param, grad, state0, state1, numel}; }
  /// Elements [offset, offset + numel): an offset of 1 makes every array misaligned for
  /// vector access.
  Segment ViewAt(int64_t offset, int64_t numel, DType grad_type) const {
    const int64_t grad_bytes = static_cast<int64_t>(DTypeSize(grad_type));
    return {master + offset, model_param == nullptr ? nullptr : model_param + offset,
            static_cast<char*>(grad) + offset * grad_bytes, state0 + offset, state1 + offset, numel};
  }
  void Download(SegmentStorage& h) const {
    ToHost(h.master, master); ToHost(h.state0, state0); ToHost(h.state1, state1); ToHost(h.model_param, model_param);
  }
};

inline bool HaveDevice() { return CudaDeviceCount() > 0; }

}  // namespace zero::testing

#endif  // ZERO_TESTS_GPU_DEVICE_TEST_UTIL_H_
