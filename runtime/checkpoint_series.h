// Which checkpoint a directory names: a series' checkpoints in the order they were saved,
// and the one a load of a directory reads (its `latest`, itself, or the newest of a series
// whose first save stopped before writing `latest`). Internal to runtime/.
#ifndef ZERO_RUNTIME_CHECKPOINT_SERIES_H_
#define ZERO_RUNTIME_CHECKPOINT_SERIES_H_

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "zero/status.h"

namespace zero::runtime {

/// A checkpoint of a series in a root (a directory holding a readable meta.json; not a
/// symlink, nor the .partial and .old leftovers of an interrupted save).
struct SeriesEntry {
  int64_t series_seq, step;
  std::string tag;
  bool operator<(const SeriesEntry& other) const {
    return std::tie(series_seq, step, tag) < std::tie(other.series_seq, other.step, other.tag);
  }
};
/// The checkpoints in `root`, oldest save first (by series_seq, then step for checkpoints
/// written before it was recorded, then name).
std::vector<SeriesEntry> SeriesCheckpoints(const std::string& root);
/// The checkpoint `dir` names: when it holds a `latest` file (a series written by
/// SaveCheckpoint(root, tag)), the tag that file names; else `dir` itself when it holds a
/// meta.json; else, when it holds checkpoints of a series (written by SaveCheckpoint(root, tag),
/// whose first save stopped after its checkpoint was complete and before `latest` was
/// written), the newest of them; else `dir`. A `latest` that is a dangling link is an error.
StatusOr<std::string> ResolveCheckpointDir(const std::string& dir);

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_CHECKPOINT_SERIES_H_
