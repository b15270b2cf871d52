// The CUDA kernels' launch tables, built on the host: every element of every non-empty
// segment is covered by exactly one block, found by the same BlockRange the kernels call;
// tables hold at most kSegmentsPerLaunch segments, in order, with their aux arrays, scalars
// and indexes. Random segment lists with empty, odd and multi-chunk sizes.
#include "kernels/launch_table.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tests/status_matchers.h"

namespace zero::kernels {
namespace {

using zero::testing::IsOk;
using zero::testing::StatusIs;

std::vector<Segment> RandomSegments(std::mt19937_64& rng, int count) {
  std::vector<Segment> segments(count);
  for (Segment& s : segments) {
    switch (rng() % 4) {
      case 0: s.numel = 0; break;                                               // skipped
      case 1: s.numel = 1 + static_cast<int64_t>(rng() % 17); break;            // tiny, odd
      case 2: s.numel = kChunkElems * (1 + rng() % 3); break;                  // whole chunks
      default: s.numel = 1 + static_cast<int64_t>(rng() % (5 * kChunkElems)); break;  // ragged
    }
  }
  return segments;
}

TEST(LaunchTable, EveryElementIsCoveredOnceByTheBlocksTheKernelsFind) {
  std::mt19937_64 rng(20261122);
  for (int trial = 0; trial < 200; ++trial) {
    const int count = static_cast<int>(rng() % 80);
    const std::vector<Segment> segments = RandomSegments(rng, count);
    std::vector<float*> aux(count);
    std::vector<float> scalars(count);
    for (int i = 0; i < count; ++i) {
      aux[i] = reinterpret_cast<float*>(static_cast<uintptr_t>(0x1000 * (i + 1)));
      scalars[i] = 0.5f * static_cast<float>(i);
    }
    auto tables = BuildLaunchTables(segments, aux, scalars);
    ASSERT_THAT(tables, IsOk());
    std::vector<std::vector<int>> hits(count);  // per segment, per element: blocks covering it
    for (int i = 0; i < count; ++i) hits[i].assign(static_cast<size_t>(segments[i].numel), 0);
    int previous_index = -1;
    for (const LaunchTable& t : *tables) {
      ASSERT_GE(t.count, 1);
      ASSERT_LE(t.count, kSegmentsPerLaunch);
      for (int k = 0; k < t.count; ++k) {
        const int i = t.index[k];
        EXPECT_GT(i, previous_index) << "segments out of order";
        previous_index = i;
        EXPECT_EQ(t.segments[k].numel, segments[i].numel);
        EXPECT_EQ(t.aux[k], aux[i]);
        EXPECT_EQ(t.scalar[k], scalars[i]);
        EXPECT_EQ(t.first_block[k + 1] - t.first_block[k], (segments[i].numel + kChunkElems - 1) / kChunkElems);
      }
      for (int block = 0; block < t.blocks(); ++block) {
        int slot = -1;
        int64_t begin = 0, end = 0;
        BlockRange(t, block, &slot, &begin, &end);
        ASSERT_GE(slot, 0);
        ASSERT_LT(slot, t.count);
        ASSERT_LT(begin, end) << "an empty block";
        ASSERT_LE(end - begin, kChunkElems);
        for (int64_t e = begin; e < end; ++e) ++hits[t.index[slot]][static_cast<size_t>(e)];
      }
    }
    for (int i = 0; i < count; ++i) {
      for (size_t e = 0; e < hits[i].size(); ++e) {
        ASSERT_EQ(hits[i][e], 1) << "trial " << trial << " segment " << i << " element " << e;
      }
    }
    int64_t blocks = 0;  // what a step's squared-gradient partials are sized by
    for (const LaunchTable& t : *tables) blocks += t.blocks();
    EXPECT_EQ(LaunchBlocks(segments), blocks);
    // A full table is flushed at kSegmentsPerLaunch; the rest are the leftovers.
    int non_empty = 0;
    for (const Segment& s : segments) non_empty += s.numel > 0 ? 1 : 0;
    EXPECT_EQ(static_cast<int>(tables->size()), (non_empty + kSegmentsPerLaunch - 1) / kSegmentsPerLaunch);
  }
}

TEST(LaunchTable, MismatchedListsAndOversizedSegmentsAreRefused) {
  std::vector<Segment> segments(3);
  for (Segment& s : segments) s.numel = 10;
  std::vector<float*> two_aux(2);
  EXPECT_THAT(BuildLaunchTables(segments, two_aux, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<float> four_scalars(4);
  EXPECT_THAT(BuildLaunchTables(segments, {}, four_scalars), StatusIs(absl::StatusCode::kInvalidArgument));
  segments[1].numel = (kMaxBlocksPerLaunch + 1) * kChunkElems;  // never allocated: arithmetic only
  EXPECT_THAT(BuildLaunchTables(segments, {}, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(BuildLaunchTables({}, {}, {}), IsOk());
  EXPECT_TRUE(BuildLaunchTables({}, {}, {})->empty());
}

TEST(LaunchTable, AFullGridStartsANewLaunch) {
  // Two segments whose blocks together pass the grid limit go to two launches.
  std::vector<Segment> segments(2);
  segments[0].numel = kMaxBlocksPerLaunch * kChunkElems;
  segments[1].numel = 1;
  auto tables = BuildLaunchTables(segments, {}, {});
  ASSERT_THAT(tables, IsOk());
  ASSERT_EQ(tables->size(), 2u);
  EXPECT_EQ((*tables)[0].blocks(), kMaxBlocksPerLaunch);
  EXPECT_EQ((*tables)[1].blocks(), 1);
  EXPECT_EQ((*tables)[1].index[0], 1);
}

}  // namespace
}  // namespace zero::kernels
