// zero-ckpt inspect and verify.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "commands.h"
#include "zero/checkpoint.h"

namespace zero::tools {
namespace {

// Names widen the column up to this; a longer one is printed whole, its row unaligned.
constexpr size_t kNameColumn = 60;

std::string FileName(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

// `text` as a terminal shows it safely: control bytes (an escape sequence in a param name
// could rewrite the screen) as \xNN, except those listed in `kept`. Names are UTF-8
// (registration checks that), so every other byte passes as it is.
std::string Printable(const std::string& text, const char* kept = "") {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    const bool control = byte < 0x20 || byte == 0x7f;
    if (control && (c == '\0' || std::strchr(kept, c) == nullptr)) {
      out += absl::StrFormat("\\x%02x", byte);
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

Status Inspect(const std::string& dir) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(dir));
  const Status intact = reader->Verify();
  std::printf("checkpoint  %s  (format %d)\n", reader->dir().c_str(), reader->format());
  std::printf("step %lld · stage %d · world %d · optimizer %s (%d moment buffer%s) · loss scale %g\n",
              static_cast<long long>(reader->step()), reader->stage(), reader->world(), reader->optimizer().c_str(),
              reader->moments(), reader->moments() == 1 ? "" : "s", reader->loss_scale());
  if (!reader->user_data().empty()) {
    std::printf("user data: %s\n", Printable(reader->user_data(), "\n\t").c_str());
  }
  int64_t elements = 0, saved = 0;
  size_t width = 4;
  std::vector<std::string> names;
  for (const CheckpointReader::Param& p : reader->params()) {
    elements += p.numel;
    saved += p.saved ? p.numel : 0;
    names.push_back(Printable(p.name));
    width = std::max(width, std::min(names.back().size(), kNameColumn));
  }
  std::printf("\nparams: %zu, %lld elements (%lld saved; frozen params only with checkpoint.save_frozen)\n",
              reader->params().size(), static_cast<long long>(elements), static_cast<long long>(saved));
  for (size_t i = 0; i < names.size(); ++i) {
    const CheckpointReader::Param& p = reader->params()[i];
    std::printf("  %-*s  [%s]  %s%s\n", static_cast<int>(width), names[i].c_str(), absl::StrJoin(p.shape, ", ").c_str(),
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
