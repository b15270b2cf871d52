// Device and pinned allocations through the accounting allocator (label gpu: skips without a
// CUDA device).
#include <gtest/gtest.h>

#include "base/allocator.h"

namespace zero::base {
namespace {

TEST(AllocatorGpu, DeviceAndPinnedBuffersAreCounted) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: nothing to check here";
  Allocator allocator;
  auto device = allocator.Allocate(1 << 20, MemoryCategory::kParams, Placement::kDevice);
  ASSERT_TRUE(device.ok()) << device.status();
  auto pinned = allocator.Allocate(1 << 16, MemoryCategory::kCommBuffers, Placement::kPinnedHost);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(allocator.Stats().total_current, (1 << 20) + (1 << 16));
  device->Reset();
  pinned->Reset();
  EXPECT_EQ(allocator.Stats().total_current, 0);
  auto too_big = allocator.Allocate(int64_t{1} << 50, MemoryCategory::kGathered, Placement::kDevice);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace zero::base
