// Device and pinned allocations through the accounting allocator (label gpu: skips without a
// CUDA device).
#include <gtest/gtest.h>

#include "base/allocator.h"
#include "tests/status_matchers.h"

namespace zero::base {
namespace {

using zero::testing::IsOk;
using zero::testing::StatusIs;

TEST(AllocatorGpu, DeviceAndPinnedBuffersAreCounted) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: nothing to check here";
  Allocator allocator;
  auto device = allocator.Allocate(1 << 20, MemoryCategory::kParams, Placement::kDevice);
  ASSERT_THAT(device, IsOk());
  auto pinned = allocator.Allocate(1 << 16, MemoryCategory::kCommBuffers, Placement::kPinnedHost);
  ASSERT_THAT(pinned, IsOk());
  EXPECT_EQ(allocator.Stats().total_current, (1 << 20) + (1 << 16));
  device->Reset();
  pinned->Reset();
  EXPECT_EQ(allocator.Stats().total_current, 0);
  auto too_big = allocator.Allocate(int64_t{1} << 50, MemoryCategory::kGathered, Placement::kDevice);
  EXPECT_THAT(too_big, StatusIs(absl::StatusCode::kResourceExhausted));
}

}  // namespace
}  // namespace zero::base
