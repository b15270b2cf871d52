// zero-ckpt reshard: the checkpoint's records rewritten as the rank files a job at `world`
// ranks reads (each rank one file of its own), by zero::ReshardCheckpoint: one new rank at a
// time, no engines, memory independent of `world`.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "commands.h"
#include "zero/checkpoint.h"

namespace zero::tools {

Status Reshard(const std::string& dir, int world, const std::string& out) {
  if (world < 1 || world > 4096) return absl::InvalidArgumentError(absl::StrCat("--world ", world, ": 1 to 4096"));
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(dir));
  ZERO_RETURN_IF_ERROR(OutputOutsideInput(dir, reader->dir(), out));
  std::error_code error;
  if (std::filesystem::exists(std::filesystem::path(out) / "meta.json", error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--out ", out, " holds a checkpoint already; reshard writes a new directory and never replaces one: "
        "choose another name, or remove it first"));
  }
  ZERO_RETURN_IF_ERROR(ReshardCheckpoint(reader->dir(), world, out));
  std::printf("%s (world %d, step %lld) -> %s (world %d)\n", reader->dir().c_str(), reader->world(),
              static_cast<long long>(reader->step()), out.c_str(), world);
  return absl::OkStatus();
}

}  // namespace zero::tools
