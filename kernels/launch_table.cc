#include "kernels/launch_table.h"

#include "absl/strings/str_cat.h"

namespace zero::kernels {

StatusOr<std::vector<LaunchTable>> BuildLaunchTables(absl::Span<const Segment> segments,
                                                     absl::Span<float* const> aux,
                                                     absl::Span<const float> scalars) {
  if ((!aux.empty() && aux.size() != segments.size()) || (!scalars.empty() && scalars.size() != segments.size())) {
    return absl::InvalidArgumentError(absl::StrCat("launch tables: ", segments.size(), " segments but ", aux.size(),
                                                   " aux arrays and ", scalars.size(), " scalars"));
  }
  std::vector<LaunchTable> tables;
  LaunchTable table{};
  int64_t blocks = 0;
  auto flush = [&] {
    if (table.count == 0) return;
    table.first_block[table.count] = static_cast<int>(blocks);
    tables.push_back(table);
    table = LaunchTable{};
    blocks = 0;
  };
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.numel <= 0) continue;
    const int64_t needed = (s.numel + kChunkElems - 1) / kChunkElems;
    if (needed > kMaxBlocksPerLaunch) {
      return absl::InvalidArgumentError(absl::StrCat("launch tables: segment ", i, " has ", s.numel,
                                                     " elements, more than one launch covers"));
    }
    if (blocks + needed > kMaxBlocksPerLaunch) flush();
    table.segments[table.count] = s;
    table.aux[table.count] = aux.empty() ? nullptr : aux[i];
    table.scalar[table.count] = scalars.empty() ? 0.0f : scalars[i];
    table.index[table.count] = static_cast<int>(i);
    table.first_block[table.count] = static_cast<int>(blocks);
    blocks += needed;
    if (++table.count == kSegmentsPerLaunch) flush();
  }
  flush();
  return tables;
}

}  // namespace zero::kernels
