#include "kernels/launch_table.h"

#include "absl/strings/str_cat.h"

namespace zero::kernels {

Status CheckLaunchArguments(absl::Span<const Segment> segments, absl::Span<float* const> aux,
                            absl::Span<const float> scalars) {
  if ((!aux.empty() && aux.size() != segments.size()) || (!scalars.empty() && scalars.size() != segments.size())) {
    return absl::InvalidArgumentError(absl::StrCat("launch tables: ", segments.size(), " segments but ", aux.size(),
                                                   " aux arrays and ", scalars.size(), " scalars"));
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    if ((segments[i].numel + kChunkElems - 1) / kChunkElems > kMaxBlocksPerLaunch) {
      return absl::InvalidArgumentError(absl::StrCat("launch tables: segment ", i, " has ", segments[i].numel,
                                                     " elements, more than one launch covers"));
    }
  }
  return absl::OkStatus();
}

int64_t LaunchBlocks(absl::Span<const Segment> segments) {
  int64_t blocks = 0;
  for (const Segment& s : segments) {
    if (s.numel > 0) blocks += (s.numel + kChunkElems - 1) / kChunkElems;  // empty ones: none
  }
  return blocks;
}

StatusOr<std::vector<LaunchTable>> BuildLaunchTables(absl::Span<const Segment> segments,
                                                     absl::Span<float* const> aux,
                                                     absl::Span<const float> scalars) {
  std::vector<LaunchTable> tables;
  ZERO_RETURN_IF_ERROR(ForEachLaunchTable(segments, aux, scalars, [&tables](const LaunchTable& table) {
    tables.push_back(table);
    return absl::OkStatus();
  }));
  return tables;
}

}  // namespace zero::kernels
