// zero::CheckpointReader: a checkpoint's contents without an engine.
#include "zero/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint_format.h"
#include "runtime/checkpoint_series.h"

namespace zero {

using runtime::CheckpointMeta;
using runtime::RankFileReader;

struct CheckpointReader::State {
  std::string dir;
  CheckpointMeta meta;
  std::vector<Param> params;
  std::vector<File> files;
  std::vector<std::unique_ptr<RankFileReader>> readers;  // null where the file failed to open
};

CheckpointReader::CheckpointReader(std::unique_ptr<State> state) : state_(std::move(state)) {}
CheckpointReader::~CheckpointReader() = default;

StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& target) {
  auto state = std::make_unique<State>();
  ZERO_ASSIGN_OR_RETURN(state->dir, runtime::ResolveCheckpointDir(target));
  ZERO_ASSIGN_OR_RETURN(state->meta, runtime::ReadCheckpointMeta(state->dir));
  for (const CheckpointMeta::Param& p : state->meta.params) {
    StatusOr<DType> dtype = ParseDType(p.dtype);
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", state->dir, "/meta.json: param \"", p.name,
                                                     "\": ", dtype.status().message()));
    }
    state->params.push_back({p.name, p.shape, *dtype, p.requires_grad, p.saved, p.numel, p.aliases});
  }
  for (int r = 0; r < state->meta.world; ++r) {
    File file;
    file.path = runtime::RankFilePath(state->dir, r, state->meta.world);
    std::error_code error;
    file.bytes = static_cast<int64_t>(std::filesystem::file_size(file.path, error));
    if (error) file.bytes = 0;
    StatusOr<std::unique_ptr<RankFileReader>> reader = RankFileReader::Open(file.path, state->meta, r);
    file.status = reader.status();
    if (reader.ok()) file.records = static_cast<int64_t>((*reader)->records().size());
    state->files.push_back(std::move(file));
    state->readers.push_back(reader.ok() ? std::move(*reader) : nullptr);
  }
  return std::unique_ptr<CheckpointReader>(new CheckpointReader(std::move(state)));
}

const std::string& CheckpointReader::dir() const { return state_->dir; }
int CheckpointReader::format() const { return state_->meta.format; }
int CheckpointReader::world() const { return state_->meta.world; }
int CheckpointReader::stage() const { return state_->meta.stage; }
int64_t CheckpointReader::step() const { return state_->meta.step; }
const std::string& CheckpointReader::optimizer() const { return state_->meta.optimizer; }
int CheckpointReader::moments() const { return state_->meta.moments; }
const std::string& CheckpointReader::user_data() const { return state_->meta.user_data; }
float CheckpointReader::loss_scale() const { return state_->meta.scaler.scale; }
const std::vector<CheckpointReader::Param>& CheckpointReader::params() const { return state_->params; }
const std::vector<CheckpointReader::File>& CheckpointReader::files() const { return state_->files; }

Status CheckpointReader::Verify() {
  Status first;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> spans(state_->params.size());
  std::vector<float> values;
  for (size_t f = 0; f < state_->files.size(); ++f) {
    RankFileReader* reader = state_->readers[f].get();
    for (size_t k = 0; reader != nullptr && k < reader->records().size(); ++k) {
      const Status read = reader->Read(k, &values);
      if (!read.ok()) {
        state_->files[f].status = read;
        break;
      }
      const auto& r = reader->records()[k];
      spans[r.param].emplace_back(r.begin, r.begin + r.numel);
    }
    first.Update(state_->files[f].status);
  }
  ZERO_RETURN_IF_ERROR(first);
  for (size_t p = 0; p < state_->params.size(); ++p) {
    if (!state_->params[p].saved) continue;
    ZERO_RETURN_IF_ERROR(runtime::CheckTiling(std::move(spans[p]), 0, state_->params[p].numel,
                                               "param \"" + state_->params[p].name + "\""));
  }
  return absl::OkStatus();
}

Status CheckpointReader::ReadParam(int param, float* out) {
  if (param < 0 || static_cast<size_t>(param) >= state_->params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("ReadParam: param ", param, " of ", state_->params.size()));
  }
  const Param& p = state_->params[param];
  if (!p.saved) {
    return absl::FailedPreconditionError(absl::StrCat("ReadParam: \"", p.name, "\" is frozen (requires_grad = "
                                                      "false) and was not saved: save with "
                                                      "checkpoint.save_frozen = true to keep frozen params"));
  }
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::vector<float> values;
  for (size_t f = 0; f < state_->files.size(); ++f) {
    RankFileReader* reader = state_->readers[f].get();
    if (reader == nullptr) return state_->files[f].status;
    for (size_t k = 0; k < reader->records().size(); ++k) {
      const auto& r = reader->records()[k];
      if (r.param != param) continue;
      ZERO_RETURN_IF_ERROR(reader->Read(k, &values));
      if (r.numel > 0) std::memcpy(out + r.begin, values.data(), static_cast<size_t>(r.numel) * sizeof(float));
      spans.emplace_back(r.begin, r.begin + r.numel);
    }
  }
  return runtime::CheckTiling(std::move(spans), 0, p.numel, "param \"" + p.name + "\"");
}

}  // namespace zero
