// Which checkpoint a directory names (checkpoint_series.h).
#include "runtime/checkpoint_series.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/checkpoint_files.h"
#include "runtime/checkpoint_format.h"

namespace zero::runtime {
namespace {

constexpr int64_t kMaxLatestBytes = 4096;  // a `latest` file: one tag and a newline

}  // namespace

std::vector<SeriesEntry> SeriesCheckpoints(const std::string& root) {
  std::vector<SeriesEntry> found;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    const bool leftover = absl::EndsWith(name, ".partial") || absl::EndsWith(name, ".old");
    if (leftover || entry.is_symlink(error) || !entry.is_directory(error)) continue;
    StatusOr<CheckpointMeta> meta = ReadCheckpointMeta(entry.path().string());
    if (meta.ok()) found.push_back({meta->series_seq, meta->step, name});
  }
  std::sort(found.begin(), found.end());
  return found;
}

StatusOr<std::string> ResolveCheckpointDir(const std::string& target) {
  const std::string dir = TrimmedDir(target);
  // `latest` first: a series root may also hold an older checkpoint of its own (meta.json).
  StatusOr<std::string> latest = ReadRegularFile(dir + "/latest", kMaxLatestBytes);
  std::error_code error;
  if (absl::IsNotFound(latest.status()) && !std::filesystem::is_symlink(dir + "/latest", error)) {
    if (std::filesystem::exists(dir + "/meta.json", error)) return dir;
    // A series whose first save was complete (swapped in) when the job died, before `latest`:
    // the newest of the checkpoints SaveCheckpoint(root, tag) wrote there (series_seq > 0),
    // not a folder of standalone checkpoints.
    std::vector<SeriesEntry> series = SeriesCheckpoints(dir);
    series.erase(std::remove_if(series.begin(), series.end(), [](const SeriesEntry& e) { return e.series_seq <= 0; }),
                 series.end());
    return series.empty() ? dir : dir + "/" + series.back().tag;  // ReadCheckpointMeta says what is missing
  }
  ZERO_RETURN_IF_ERROR(latest.status());
  const std::string tag = latest->substr(0, latest->find('\n'));
  const bool printable = std::all_of(tag.begin(), tag.end(), [](char c) { return c >= 0x20 && c != 0x7f; });
  if (tag.empty() || !printable || tag.find('/') != std::string::npos || tag == "." || tag == "..") {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", dir, "/latest does not name a checkpoint in ",
                                                   dir, " (it holds \"", absl::CHexEscape(tag.substr(0, 64)),
                                                   "\"; damaged?); load a checkpoint directory of it by name"));
  }
  return dir + "/" + tag;
}

}  // namespace zero::runtime
