// The multi-tensor launch tables of the CUDA kernels, built on the host: a segment list cut
// into launches of at most kSegmentsPerLaunch segments, with one block per kChunkElems
// elements of each segment. Plain arithmetic, so it is tested on machines without a GPU
// (tests/unit/launch_table_test.cc); the kernels find their block's range with BlockRange,
// the same function the tests check.
#ifndef ZERO_KERNELS_LAUNCH_TABLE_H_
#define ZERO_KERNELS_LAUNCH_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/segments.h"
#include "zero/status.h"

#if defined(__CUDACC__)
#define ZERO_HOST_DEVICE __host__ __device__
#else
#define ZERO_HOST_DEVICE
#endif

namespace zero::kernels {

/// Segments per launch: keeps a table (about 1.7 KB) inside the 4 KB kernel-argument limit.
inline constexpr int kSegmentsPerLaunch = 24;
/// Elements per block: 512 threads × 4 vector iterations of 4. Small enough that a 1M-element
/// shard still fills an H100's 132 SMs (128 blocks; with 64K chunks it ran 16 blocks at 0.34 of
/// the copy roofline), large enough that block scheduling stays negligible at 1G elements.
inline constexpr int64_t kChunkElems = 8192;
/// The most blocks one launch may have (CUDA's grid x-dimension limit is 2^31 − 1).
inline constexpr int64_t kMaxBlocksPerLaunch = (int64_t{1} << 31) - 1;

/// What one launch covers: segments, an optional float array and scalar per segment (LAMB's
/// update buffer and trust ratio), each segment's index in the caller's list, and per segment
/// the first block's index (first_block[count] is the launch's block count).
struct LaunchTable {
  Segment segments[kSegmentsPerLaunch];
  float* aux[kSegmentsPerLaunch];
  float scalar[kSegmentsPerLaunch];
  int index[kSegmentsPerLaunch];
  int first_block[kSegmentsPerLaunch + 1];
  int count;

  ZERO_HOST_DEVICE int blocks() const { return first_block[count]; }
};

/// Calls launch(table) for each table of `segments` in order (empty segments are skipped),
/// building one table at a time on the stack: nothing is allocated on the kernels' launch path.
/// `aux` and `scalars` are empty or hold one entry per segment; kInvalidArgument otherwise, or
/// when one segment would need more than kMaxBlocksPerLaunch blocks (checked before any launch).
template <typename Launch>
Status ForEachLaunchTable(absl::Span<const Segment> segments, absl::Span<float* const> aux,
                          absl::Span<const float> scalars, Launch launch);

/// The tables ForEachLaunchTable would launch, collected (for tests and inspection).
StatusOr<std::vector<LaunchTable>> BuildLaunchTables(absl::Span<const Segment> segments,
                                                     absl::Span<float* const> aux,
                                                     absl::Span<const float> scalars);

/// The number of blocks ForEachLaunchTable launches over `segments`, all tables together: one
/// per kChunkElems elements of each segment.
int64_t LaunchBlocks(absl::Span<const Segment> segments);

/// The argument checks of ForEachLaunchTable.
Status CheckLaunchArguments(absl::Span<const Segment> segments, absl::Span<float* const> aux,
                            absl::Span<const float> scalars);

/// Block `block` of a launch of `t`: its slot in the table (`*slot`) and its element range
/// [*begin, *end) of that segment.
ZERO_HOST_DEVICE inline void BlockRange(const LaunchTable& t, int block, int* slot, int64_t* begin,
                                        int64_t* end) {
  int s = 0;
  while (s + 1 < t.count && block >= t.first_block[s + 1]) ++s;
  *slot = s;
  *begin = static_cast<int64_t>(block - t.first_block[s]) * kChunkElems;
  const int64_t last = *begin + kChunkElems;
  *end = last < t.segments[s].numel ? last : t.segments[s].numel;
}

template <typename Launch>
Status ForEachLaunchTable(absl::Span<const Segment> segments, absl::Span<float* const> aux,
                          absl::Span<const float> scalars, Launch launch) {
  ZERO_RETURN_IF_ERROR(CheckLaunchArguments(segments, aux, scalars));
  LaunchTable table{};
  int64_t blocks = 0;
  auto flush = [&]() -> Status {
    if (table.count == 0) return absl::OkStatus();
    table.first_block[table.count] = static_cast<int>(blocks);
    ZERO_RETURN_IF_ERROR(launch(table));
    table = LaunchTable{};
    blocks = 0;
    return absl::OkStatus();
  };
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.numel <= 0) continue;
    const int64_t needed = (s.numel + kChunkElems - 1) / kChunkElems;
    if (blocks + needed > kMaxBlocksPerLaunch) ZERO_RETURN_IF_ERROR(flush());
    table.segments[table.count] = s;
    table.aux[table.count] = aux.empty() ? nullptr : aux[i];
    table.scalar[table.count] = scalars.empty() ? 0.0f : scalars[i];
    table.index[table.count] = static_cast<int>(i);
    table.first_block[table.count] = static_cast<int>(blocks);
    blocks += needed;
    if (++table.count == kSegmentsPerLaunch) ZERO_RETURN_IF_ERROR(flush());
  }
  return flush();
}

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_LAUNCH_TABLE_H_
