// The accounting allocator: every byte counted under its category, peaks kept, frees and moves
// un-count exactly once, concurrent use is safe; zeroed host buffers cost resident memory only
// as they are written.
#include "base/allocator.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <thread>
#include <vector>

#include "tests/status_matchers.h"

namespace zero::base {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using zero::testing::IsOk;
using zero::testing::StatusIs;

TEST(Allocator, CountsCurrentAndPeakPerCategory) {
  Allocator allocator;
  {
    auto params = allocator.Allocate(1000, MemoryCategory::kParams, Placement::kHost);
    ASSERT_THAT(params, IsOk());
    auto grads = allocator.Allocate(300, MemoryCategory::kGrads, Placement::kHost);
    ASSERT_THAT(grads, IsOk());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(params->data()) % 64, 0u);
    MemoryStats stats = allocator.Stats();
    EXPECT_EQ(stats.Current(MemoryCategory::kParams), 1000);
    EXPECT_EQ(stats.Current(MemoryCategory::kGrads), 300);
    EXPECT_EQ(stats.total_current, 1300);
    grads->Reset();
    stats = allocator.Stats();
    EXPECT_EQ(stats.Current(MemoryCategory::kGrads), 0);
    EXPECT_EQ(stats.Peak(MemoryCategory::kGrads), 300);
    auto workspace = allocator.Allocate(100, MemoryCategory::kWorkspace, Placement::kHost);
    ASSERT_THAT(workspace, IsOk());
    stats = allocator.Stats();
    EXPECT_EQ(stats.total_peak, 1300);  // 1000 + 100 now; the peak was 1000 + 300
  }
  const MemoryStats stats = allocator.Stats();
  EXPECT_EQ(stats.total_current, 0);
  EXPECT_EQ(stats.Peak(MemoryCategory::kParams), 1000);
  EXPECT_EQ(stats.Peak(MemoryCategory::kWorkspace), 100);
}

TEST(Allocator, MovesTransferOwnershipAndCountOnce) {
  Allocator allocator;
  auto a = allocator.Allocate(64, MemoryCategory::kOptimizer, Placement::kHost);
  ASSERT_THAT(a, IsOk());
  Buffer moved = std::move(*a);
  Buffer assigned;
  assigned = std::move(moved);
  EXPECT_EQ(moved.data(), nullptr);
  EXPECT_EQ(assigned.bytes(), 64);
  EXPECT_EQ(allocator.Stats().Current(MemoryCategory::kOptimizer), 64);
  assigned = Buffer();
  EXPECT_EQ(allocator.Stats().Current(MemoryCategory::kOptimizer), 0);
}

TEST(Allocator, CopiesShareOneTracker) {
  Allocator allocator;
  Allocator copy = allocator;
  auto buffer = copy.Allocate(128, MemoryCategory::kCommBuffers, Placement::kHost);
  ASSERT_THAT(buffer, IsOk());
  EXPECT_EQ(allocator.Stats().Current(MemoryCategory::kCommBuffers), 128);
}

TEST(Allocator, BuffersMayOutliveTheirAllocator) {
  Buffer survivor;
  {
    Allocator allocator;
    survivor = std::move(*allocator.Allocate(32, MemoryCategory::kParams, Placement::kHost));
  }
  EXPECT_EQ(survivor.bytes(), 32);
  survivor.Reset();  // must not touch freed tracker memory (run under ASan/valgrind to see)
}

TEST(Allocator, RejectsBadSizesAndUnavailablePlacements) {
  Allocator allocator;
  auto negative = allocator.Allocate(-1, MemoryCategory::kParams, Placement::kHost);
  EXPECT_THAT(negative, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("params")));
  auto empty = allocator.Allocate(0, MemoryCategory::kParams, Placement::kHost);
  ASSERT_THAT(empty, IsOk());
  EXPECT_EQ(empty->data(), nullptr);
  auto huge = allocator.Allocate(int64_t{1} << 62, MemoryCategory::kGathered, Placement::kHost);
  EXPECT_THAT(huge, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(allocator.Stats().total_current, 0);
  if (CudaDeviceCount() == 0) {
    auto device = allocator.Allocate(16, MemoryCategory::kParams, Placement::kDevice);
    EXPECT_THAT(device, Not(IsOk()));
    EXPECT_EQ(allocator.Stats().total_current, 0);
  }
}

TEST(Allocator, ConcurrentRanksKeepExactTotals) {
  Allocator allocator;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&allocator, r] {
      for (int i = 0; i < 500; ++i) {
        auto b = allocator.Allocate(8 * (r + 1), static_cast<MemoryCategory>(r), Placement::kHost);
        ASSERT_THAT(b, IsOk());
      }
    });
  }
  for (auto& t : ranks) t.join();
  const MemoryStats stats = allocator.Stats();
  EXPECT_EQ(stats.total_current, 0);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(stats.peak[r] % (8 * (r + 1)), 0);
}

// This process's resident memory now, in bytes (/proc/self/statm).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

TEST(Allocator, ZeroedHostBuffersReadAsZerosAndCommitPagesAsTheyAreWritten) {
  constexpr int64_t kBytes = int64_t{64} << 20;
  Allocator allocator;
  const int64_t before = ResidentBytes();
  auto buffer = allocator.AllocateZeroed(kBytes, MemoryCategory::kParams, Placement::kHost);
  ASSERT_THAT(buffer, IsOk());
  EXPECT_TRUE(buffer->reads_as_zero());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % 64, 0u);
  EXPECT_EQ(allocator.Stats().Current(MemoryCategory::kParams), kBytes);
  EXPECT_LT(ResidentBytes() - before, kBytes / 8) << "allocating committed the pages";
  const char* bytes = buffer->as<char>();
  int64_t nonzero = 0;
  for (int64_t i = 0; i < kBytes; i += 4096) nonzero += bytes[i] != 0;
  EXPECT_EQ(nonzero, 0);
  for (int64_t i = 0; i < kBytes / 2; i += 4096) buffer->as<char>()[i] = 1;  // half the pages
  const int64_t grown = ResidentBytes() - before;
  EXPECT_GT(grown, kBytes / 2 - kBytes / 8);
  EXPECT_LT(grown, kBytes / 2 + kBytes / 8);
  buffer->Reset();
  EXPECT_EQ(allocator.Stats().Current(MemoryCategory::kParams), 0);
  auto device = allocator.AllocateZeroed(1000, MemoryCategory::kParams, Placement::kDevice);
  if (device.ok()) EXPECT_FALSE(device->reads_as_zero()) << "device memory is the caller's to zero";
}

TEST(MemoryCategory, Names) {
  EXPECT_STREQ(MemoryCategoryName(MemoryCategory::kCommBuffers), "comm_buffers");
  EXPECT_STREQ(MemoryCategoryName(MemoryCategory::kGathered), "gathered");
}

}  // namespace
}  // namespace zero::base
