// zero-ckpt consolidate: the full params as a safetensors file.
//
// safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON {"name": {"dtype": "F32"|"BF16", "shape": [...], "data_offsets":
// [begin, end]}, ..., "__metadata__": {string: string}} (offsets relative to the data, which
// follows the header; the header is padded with spaces to a multiple of 8), then the data.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "commands.h"
#include "zero/checkpoint.h"

namespace zero::tools {
namespace {

// `out` is the checkpoint directory or inside it (writing there would damage the input).
Status OutputOutsideCheckpoint(const std::string& checkpoint_dir, const std::string& out) {
  std::error_code error;
  const std::filesystem::path input = std::filesystem::weakly_canonical(checkpoint_dir, error);
  const std::filesystem::path output = std::filesystem::weakly_canonical(out, error);
  if (error) return absl::OkStatus();  // nothing to compare: the write itself will say what is wrong
  const auto mismatch = std::mismatch(input.begin(), input.end(), output.begin(), output.end());
  if (mismatch.first == input.end()) {
    return absl::InvalidArgumentError(absl::StrCat("--out ", out, " is ", output == input ? "" : "inside ",
                                                   "the checkpoint ", checkpoint_dir,
                                                   ": writing there would damage it; choose a path outside"));
  }
  return absl::OkStatus();
}

// `out` would replace what the series root `dir` (a directory of step-N checkpoints) needs:
// its `latest`, its lock, a checkpoint in it, or would write into one. A new file beside
// them, or in another directory under the root, is fine.
Status OutputOutsideSeries(const std::string& dir, const std::string& out) {
  std::error_code root_error, output_error;
  const std::filesystem::path root = std::filesystem::weakly_canonical(dir, root_error);
  const std::filesystem::path output = std::filesystem::weakly_canonical(out, output_error);
  if (root_error || output_error) return absl::OkStatus();  // the write itself will say what is wrong
  const auto mismatch = std::mismatch(root.begin(), root.end(), output.begin(), output.end());
  if (mismatch.first != root.end() || mismatch.second == output.end()) return absl::OkStatus();
  const std::filesystem::path entry = root / *mismatch.second;
  const bool replaces = output == entry && (mismatch.second->string() == "latest" ||
                                            mismatch.second->string() == ".zerort-lock" ||
                                            std::filesystem::is_directory(entry, root_error));
  const bool inside_checkpoint = std::filesystem::exists(entry / "meta.json", root_error);
  if (!replaces && !inside_checkpoint) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--out ", out, replaces ? " would replace " : " is inside ",
                                                 entry.string(), ", which the checkpoint series ", dir,
                                                 " needs to resume: choose another name or a path outside"));
}

}  // namespace

Status OutputOutsideInput(const std::string& dir, const std::string& checkpoint_dir, const std::string& out) {
  ZERO_RETURN_IF_ERROR(OutputOutsideCheckpoint(checkpoint_dir, out));
  ZERO_RETURN_IF_ERROR(OutputOutsideSeries(dir, out));
  // One checkpoint of a series, named itself: its series is the directory around it.
  return OutputOutsideSeries(std::filesystem::absolute(checkpoint_dir).parent_path().string(), out);
}

Status Consolidate(const std::string& dir, const std::string& out, DType dtype) {
  if (dtype != DType::kFP32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("--dtype ", DTypeName(dtype), ": consolidate writes fp32 or bf16"));
  }
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(dir));
  ZERO_RETURN_IF_ERROR(OutputOutsideInput(dir, reader->dir(), out));
  std::error_code error;
  if (std::filesystem::is_directory(out, error)) {
    return absl::InvalidArgumentError(absl::StrCat("--out ", out, " is a directory; name the file to write (e.g. ",
                                                   (std::filesystem::path(out) / "model.safetensors").string(), ")"));
  }
  // Every record checked first: the sizes below are then backed by the files' real bytes.
  ZERO_RETURN_IF_ERROR(reader->Verify());
  // Each param under its name and its aliases (a tied weight's other names), as the model's
  // state dict holds it: a strict load_state_dict finds every name.
  auto names_of = [](const CheckpointReader::Param& p) {
    std::vector<std::string> names = {p.name};
    names.insert(names.end(), p.aliases.begin(), p.aliases.end());
    return names;
  };
  std::set<std::string> names;
  for (const CheckpointReader::Param& p : reader->params()) {
    for (const std::string& name : names_of(p)) {
      if (name == "__metadata__" || !names.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat("param name \"", name, "\" is ",
                                                       name == "__metadata__" ? "reserved" : "not unique",
                                                       " in a safetensors file"));
      }
    }
  }
  const size_t element = DTypeSize(dtype);
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}, {"producer", "zero-ckpt consolidate"},
                            {"step", std::to_string(reader->step())}};
  int64_t offset = 0;
  int skipped = 0;
  for (const CheckpointReader::Param& p : reader->params()) {
    if (!p.saved) {
      ++skipped;
      continue;
    }
    const int64_t bytes = p.numel * static_cast<int64_t>(element);
    for (const std::string& name : names_of(p)) {  // safetensors lets no two names share bytes
      header[name] = {{"dtype", dtype == DType::kFP32 ? "F32" : "BF16"}, {"shape", p.shape},
                      {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string partial = out + ".partial";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(partial.c_str(), "wb"), &std::fclose);
  if (file == nullptr) return absl::UnavailableError(absl::StrCat("cannot create ", partial, ": ", std::strerror(errno)));
  const uint64_t length = text.size();  // little-endian on every platform ZeroRT builds for
  bool written = std::fwrite(&length, sizeof length, 1, file.get()) == 1 &&
                 std::fwrite(text.data(), 1, text.size(), file.get()) == text.size();
  std::vector<float> values;
  std::vector<uint16_t> narrow;
  for (int p = 0; written && p < static_cast<int>(reader->params().size()); ++p) {
    const CheckpointReader::Param& param = reader->params()[p];
    if (!param.saved) continue;
    values.resize(static_cast<size_t>(param.numel));
    ZERO_RETURN_IF_ERROR(reader->ReadParam(p, values.data()));
    if (dtype != DType::kFP32) {
      narrow.resize(values.size());
      for (size_t i = 0; i < values.size(); ++i) narrow[i] = FloatToBf16(values[i]);
    }
    for (size_t copy = 0; written && copy < 1 + param.aliases.size(); ++copy) {
      written = dtype == DType::kFP32
                    ? std::fwrite(values.data(), sizeof(float), values.size(), file.get()) == values.size()
                    : std::fwrite(narrow.data(), sizeof(uint16_t), narrow.size(), file.get()) == narrow.size();
    }
  }
  if (!written || std::fclose(file.release()) != 0) return absl::UnavailableError(absl::StrCat("cannot write ", partial));
  if (std::rename(partial.c_str(), out.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(partial.c_str());
    return absl::UnavailableError(absl::StrCat("cannot rename ", partial, " to ", out, ": ", why));
  }
  size_t aliases = 0;
  for (const CheckpointReader::Param& p : reader->params()) aliases += p.saved ? p.aliases.size() : 0;
  std::printf("%s: %zu params%s, %lld bytes of %s data (step %lld)%s\n", out.c_str(),
              reader->params().size() - skipped,
              aliases > 0 ? absl::StrCat(" (and ", aliases, " tied names of them)").c_str() : "",
              static_cast<long long>(offset), DTypeName(dtype),
              static_cast<long long>(reader->step()),
              skipped > 0 ? absl::StrCat("; ", skipped, " frozen params were not saved (checkpoint.save_frozen)").c_str()
                          : "");
  return absl::OkStatus();
}

}  // namespace zero::tools
