// zero-ckpt inspect and verify.
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "commands.h"
#include "zero/checkpoint.h"

namespace zero::tools {
namespace {

std::string FileName(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

}  // namespace

Status Inspect(const std::string& dir) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(dir));
  const Status intact = reader->Verify();
  std::printf("checkpoint  %s  (format %d)\n", reader->dir().c_str(), reader->format());
  std::printf("step %lld · stage %d · world %d · optimizer %s (%d moment buffer%s) · loss scale %g\n",
              static_cast<long long>(reader->step()), reader->stage(), reader->world(), reader->optimizer().c_str(),
              reader->moments(), reader->moments() == 1 ? "" : "s", reader->loss_scale());
  if (!reader->user_data().empty()) std::printf("user data: %s\n", reader->user_data().c_str());
  int64_t elements = 0, saved = 0;
  size_t width = 4;
  for (const CheckpointReader::Param& p : reader->params()) {
    elements += p.numel;
    saved += p.saved ? p.numel : 0;
    width = std::max(width, p.name.size());
  }
  std::printf("\nparams: %zu, %lld elements (%lld saved; frozen params only with checkpoint.save_frozen)\n",
              reader->params().size(), static_cast<long long>(elements), static_cast<long long>(saved));
  for (const CheckpointReader::Param& p : reader->params()) {
    std::printf("  %-*s  [%s]  %s%s\n", static_cast<int>(width), p.name.c_str(), absl::StrJoin(p.shape, ", ").c_str(),
                DTypeName(p.dtype), !p.saved ? "  (frozen: not saved)" : p.requires_grad ? "" : "  (frozen)");
  }
  std::printf("\nfiles:\n");
  int64_t total = 0;
  for (const CheckpointReader::File& f : reader->files()) {
    total += f.bytes;
    std::printf("  %-22s %12lld bytes %6lld records  %s\n", FileName(f.path).c_str(), static_cast<long long>(f.bytes),
                static_cast<long long>(f.records), f.status.ok() ? "ok" : std::string(f.status.message()).c_str());
  }
  std::printf("total %lld bytes; %s\n", static_cast<long long>(total),
              intact.ok() ? "complete, every checksum matches" : "DAMAGED (see above)");
  return intact;
}

Status Verify(const std::string& dir) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(dir));
  ZERO_RETURN_IF_ERROR(reader->Verify());
  int64_t bytes = 0;
  for (const CheckpointReader::File& f : reader->files()) bytes += f.bytes;
  std::printf("%s: complete and intact (step %lld, %d rank files, %lld bytes)\n", reader->dir().c_str(),
              static_cast<long long>(reader->step()), reader->world(), static_cast<long long>(bytes));
  return absl::OkStatus();
}

}  // namespace zero::tools
