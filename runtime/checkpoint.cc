// Checkpoints that load at any world size and stage: every rank saves the fp32 weights and
// moments of the param parts it owns, in param coordinates; on load every rank takes, from
// every file, what falls inside the parts it owns now.
//
//   DIR/meta.json            format, world, stage, step, optimizer, moment count, loss scaler,
//                            the trainer's user_data, and each param's name, shape and dtype
//                            (rank 0 writes it)
// Frozen params (requires_grad = false) are not saved: they never change; set them again with
// SetParam after loading.
//
//   DIR/rank-R-of-N.bin      "ZRTCKPT2", then records of
//                            {int32 param, int64 param_begin, int64 numel, float master[numel],
//                             float moment[numel] per moment buffer},
//                            then int64 record count and the XXH3-64 of everything before it
//                            (checkpoint_files.h). Files of format 1 ("ZRTCKPT1", the record
//                            count after the magic, no checksum) still load.
//
// Saving writes DIR.partial, and every rank's file and meta.json reach stable storage before
// rank 0 swaps it in as DIR in one rename: a crash at any point leaves the previous
// checkpoint whole. Loading checks every checksum and every field of meta.json before it
// changes anything; a damaged checkpoint is an error naming the file and the field.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint_files.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {
namespace {

constexpr char kMagicV1[8] = {'Z', 'R', 'T', 'C', 'K', 'P', 'T', '1'};
constexpr char kMagic[8] = {'Z', 'R', 'T', 'C', 'K', 'P', 'T', '2'};
constexpr int kFormat = 2;

std::string RankFile(const std::string& dir, int rank, int world) {
  return absl::StrCat(dir, "/rank-", rank, "-of-", world, ".bin");
}

Status IoError(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat("checkpoint: cannot ", what, " ", path, ": ", std::strerror(errno)));
}

// `dir` without trailing slashes (so that DIR.partial is a sibling, not a child).
std::string Trimmed(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// meta.json's fields, each checked for its type before anything is loaded.
struct Meta {
  int format = 0, world = 0, moments = 0;
  int64_t step = 0;
  std::string optimizer;
  LossScaler::State scaler;
  nlohmann::json params;
  std::string user_data;  // optional
};

Status FieldError(const std::string& path, const std::string& field, const char* expected) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, ": field \"", field,
                                                 "\" is missing or not ", expected));
}

template <typename T>
Status Field(const nlohmann::json& object, const char* key, const std::string& path,
             const std::string& field, T* out) {
  const auto it = object.find(key);
  if constexpr (std::is_same_v<T, std::string>) {
    if (it == object.end() || !it->is_string()) return FieldError(path, field, "a string");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (it == object.end() || !it->is_number()) return FieldError(path, field, "a number");
  } else {
    if (it == object.end() || !it->is_number_integer()) return FieldError(path, field, "an integer");
    const int64_t value = it->get<int64_t>();
    if (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max()) {
      return FieldError(path, field, "an integer in range");
    }
  }
  *out = it->get<T>();
  return absl::OkStatus();
}

StatusOr<Meta> ReadMeta(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  std::ifstream file(path);
  if (!file) {
    std::error_code error;
    if (!std::filesystem::exists(dir, error) && std::filesystem::exists(dir + ".partial", error)) {
      return absl::NotFoundError(absl::StrCat(
          "checkpoint: ", dir, " does not exist; ", dir, ".partial is a save that did not finish "
          "(the job stopped while saving), not a checkpoint"));
    }
    return IoError("read", path);
  }
  const nlohmann::json json = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " is not JSON (damaged?)"));
  }
  Meta meta;
  ZERO_RETURN_IF_ERROR(Field(json, "format", path, "format", &meta.format));
  if (meta.format != 1 && meta.format != kFormat) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " has format ", meta.format,
                                                   "; this ZeroRT reads formats 1 and ", kFormat));
  }
  ZERO_RETURN_IF_ERROR(Field(json, "world", path, "world", &meta.world));
  if (meta.world < 1) return FieldError(path, "world", "a positive integer");
  ZERO_RETURN_IF_ERROR(Field(json, "moments", path, "moments", &meta.moments));
  ZERO_RETURN_IF_ERROR(Field(json, "step", path, "step", &meta.step));
  ZERO_RETURN_IF_ERROR(Field(json, "optimizer", path, "optimizer", &meta.optimizer));
  const auto scaler = json.find("loss_scaler");
  if (scaler == json.end() || !scaler->is_object()) return FieldError(path, "loss_scaler", "an object");
  ZERO_RETURN_IF_ERROR(Field(*scaler, "scale", path, "loss_scaler.scale", &meta.scaler.scale));
  ZERO_RETURN_IF_ERROR(Field(*scaler, "remaining_hysteresis", path, "loss_scaler.remaining_hysteresis",
                             &meta.scaler.remaining_hysteresis));
  ZERO_RETURN_IF_ERROR(Field(*scaler, "iteration", path, "loss_scaler.iteration", &meta.scaler.iteration));
  ZERO_RETURN_IF_ERROR(Field(*scaler, "last_overflow", path, "loss_scaler.last_overflow",
                             &meta.scaler.last_overflow));
  if (json.contains("user_data")) {
    ZERO_RETURN_IF_ERROR(Field(json, "user_data", path, "user_data", &meta.user_data));
  }
  const auto params = json.find("params");
  if (params == json.end() || !params->is_array()) return FieldError(path, "params", "an array");
  for (size_t p = 0; p < params->size(); ++p) {
    const nlohmann::json& param = (*params)[p];
    const std::string field = absl::StrCat("params[", p, "]");
    if (!param.is_object()) return FieldError(path, field, "an object");
    std::string text;
    ZERO_RETURN_IF_ERROR(Field(param, "name", path, field + ".name", &text));
    ZERO_RETURN_IF_ERROR(Field(param, "dtype", path, field + ".dtype", &text));
    const auto shape = param.find("shape");
    if (shape == param.end() || !shape->is_array()) return FieldError(path, field + ".shape", "an array");
    for (const auto& d : *shape) {
      if (!d.is_number_integer()) return FieldError(path, field + ".shape", "an array of integers");
    }
  }
  meta.params = *params;
  return meta;
}

}  // namespace

Status EngineImpl::SaveCheckpoint(const std::string& target) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("SaveCheckpoint"));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "SaveCheckpoint"));
  if (micro_batch_ != 0) {
    return absl::FailedPreconditionError("SaveCheckpoint: micro-batches are pending; call it after Step()");
  }
  const std::string dir = Trimmed(target);
  const std::string partial = dir + ".partial";
  const double timeout_s = config_.guard.timeout_s;
  if (comm_.rank() == 0) {  // a fresh DIR.partial (what a crashed save left is discarded)
    std::error_code error;
    std::filesystem::remove_all(partial, error);
    std::filesystem::create_directories(partial, error);
    if (error) return absl::UnavailableError(absl::StrCat("checkpoint: cannot create ", partial, ": ", error.message()));
  }
  ZERO_RETURN_IF_ERROR(comm_.Barrier()->Wait(timeout_s));
  // Stage 0 ranks all own everything: rank 0 alone writes it. Records stream to the file.
  const bool writes = config_.stage != 0 || comm_.rank() == 0;
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<ChecksummedFile> out,
                        ChecksummedFile::Create(RankFile(partial, comm_.rank(), comm_.size())));
  ZERO_RETURN_IF_ERROR(out->Write(kMagic, sizeof kMagic));
  int64_t records = 0;
  for (size_t p = 0; writes && p < specs_.size(); ++p) {
    if (!specs_[p].requires_grad) continue;
    ZERO_ASSIGN_OR_RETURN(std::vector<OptimizerState::OwnedPart> parts, optimizer_->ReadOwned(static_cast<int>(p)));
    for (const OptimizerState::OwnedPart& part : parts) {
      const int32_t param = static_cast<int32_t>(p);
      ZERO_RETURN_IF_ERROR(out->Write(&param, sizeof param));
      ZERO_RETURN_IF_ERROR(out->Write(&part.begin, sizeof part.begin));
      ZERO_RETURN_IF_ERROR(out->Write(&part.numel, sizeof part.numel));
      ZERO_RETURN_IF_ERROR(out->Write(part.values.data(), part.values.size() * sizeof(float)));  // weights, then moments
      ++records;
    }
  }
  ZERO_RETURN_IF_ERROR(out->Write(&records, sizeof records));
  ZERO_RETURN_IF_ERROR(out->Close());
  if (comm_.rank() == 0) {
    nlohmann::json meta;
    meta["format"] = kFormat;
    meta["world"] = comm_.size();
    meta["stage"] = config_.stage;
    meta["step"] = step_;
    meta["optimizer"] = OptimizerTypeName(config_.optimizer.type);
    meta["moments"] = optimizer_->state_count();
    meta["user_data"] = user_data_;
    const LossScaler::State scaler = loss_scaler_.state();
    meta["loss_scaler"] = {{"scale", scaler.scale}, {"remaining_hysteresis", scaler.remaining_hysteresis},
                           {"iteration", scaler.iteration}, {"last_overflow", scaler.last_overflow}};
    for (const ParamSpec& s : specs_) {
      meta["params"].push_back({{"name", s.name}, {"shape", s.shape}, {"dtype", DTypeName(s.dtype)},
                                {"requires_grad", s.requires_grad}});
    }
    ZERO_RETURN_IF_ERROR(WriteFileDurably(partial + "/meta.json", meta.dump(1) + "\n"));
  }
  // Every rank's file is durable: rank 0 makes the whole directory visible at once.
  ZERO_RETURN_IF_ERROR(comm_.Barrier()->Wait(timeout_s));
  if (comm_.rank() == 0) ZERO_RETURN_IF_ERROR(PublishDirectory(partial, dir));
  // Nobody reads the checkpoint before it is in place.
  return comm_.Barrier()->Wait(timeout_s);
}

Status EngineImpl::LoadCheckpoint(const std::string& target) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("LoadCheckpoint"));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "LoadCheckpoint"));
  if (micro_batch_ != 0) return absl::FailedPreconditionError("LoadCheckpoint: micro-batches are pending");
  const std::string dir = Trimmed(target);
  ZERO_ASSIGN_OR_RETURN(const Meta meta, ReadMeta(dir));
  const nlohmann::json& params = meta.params;
  for (size_t p = 0; p < std::min(specs_.size(), params.size()); ++p) {
    const ParamSpec& s = specs_[p];
    if (params[p].value("name", "") != s.name || params[p]["shape"].get<std::vector<int64_t>>() != s.shape ||
        params[p].value("dtype", "") != DTypeName(s.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint param ", p, " is \"", params[p].value("name", ""), "\" ", params[p]["shape"].dump(), " ",
          params[p].value("dtype", ""), " but ", ParamLabel(static_cast<int>(p)), " is registered with shape ",
          nlohmann::json(s.shape).dump(), " ", DTypeName(s.dtype)));
    }
  }
  if (params.size() != specs_.size()) {
    const std::string first_unmatched = params.size() > specs_.size()
                                            ? absl::StrCat("\"", params[specs_.size()].value("name", ""), "\" is in the checkpoint only")
                                            : absl::StrCat(ParamLabel(static_cast<int>(params.size())), " is not in the checkpoint");
    return absl::InvalidArgumentError(absl::StrCat("checkpoint has ", params.size(), " params, ", specs_.size(),
                                                   " are registered: ", first_unmatched));
  }
  const int moments = meta.moments;
  if (moments != optimizer_->state_count()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint was written by optimizer \"", meta.optimizer,
                                                   "\" with ", moments, " moment buffer(s); this engine's \"",
                                                   OptimizerTypeName(config_.optimizer.type), "\" keeps ",
                                                   optimizer_->state_count()));
  }
  // Take from every saved part what overlaps the parts this rank owns now, in host copies of
  // those parts, then write them back.
  const int saved_world = meta.world;
  std::vector<float> values;
  std::map<int, std::vector<OptimizerState::OwnedPart>> owned;
  for (int q = 0; q < saved_world; ++q) {
    const std::string path = RankFile(dir, q, saved_world);
    std::ifstream in(path, std::ios::binary);
    if (!in) return IoError("read", path);
    char magic[sizeof kMagic];
    in.read(magic, sizeof magic);
    if (!in) return absl::DataLossError(absl::StrCat("checkpoint: ", path, " is truncated"));
    const bool v1 = std::memcmp(magic, kMagicV1, sizeof kMagicV1) == 0;
    if (!v1 && std::memcmp(magic, kMagic, sizeof kMagic) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " is not a ZeroRT rank file"));
    }
    // Format 2: the whole file is checked first; its records end where its footer starts.
    int64_t records = std::numeric_limits<int64_t>::max();
    std::streamoff body_end = 0;
    if (v1) {
      in.read(reinterpret_cast<char*>(&records), sizeof records);
      if (!in) return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " is truncated"));
    } else {
      ZERO_RETURN_IF_ERROR(VerifyChecksum(path));
      std::error_code error;
      const auto size = static_cast<std::streamoff>(std::filesystem::file_size(path, error));
      body_end = size - static_cast<std::streamoff>(sizeof(int64_t) + kChecksumBytes);
      if (error || body_end < static_cast<std::streamoff>(sizeof kMagic)) {
        return absl::DataLossError(absl::StrCat("checkpoint: ", path, " is truncated"));
      }
    }
    for (int64_t k = 0; k < records; ++k) {
      if (!v1 && in.tellg() >= body_end) {  // the footer: its count must match
        int64_t written = -1;
        in.read(reinterpret_cast<char*>(&written), sizeof written);
        if (!in || written != k) {
          return absl::DataLossError(absl::StrCat("checkpoint: ", path, " holds ", k,
                                                  " records but its footer says ", written));
        }
        break;
      }
      int32_t param = 0;
      int64_t begin = 0, numel = 0;
      in.read(reinterpret_cast<char*>(&param), sizeof param);
      in.read(reinterpret_cast<char*>(&begin), sizeof begin);
      in.read(reinterpret_cast<char*>(&numel), sizeof numel);
      if (!in || param < 0 || param >= num_params() || numel < 0) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " is truncated or corrupt (record ", k, ")"));
      }
      // The record must lie inside its param: a size read from the file is never trusted
      // for an allocation (a fuzzed file asked for 7e15 floats).
      int64_t param_numel = 1;
      for (int64_t d : specs_[param].shape) param_numel *= d;
      if (begin < 0 || begin > param_numel || numel > param_numel - begin) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint: ", path, " is corrupt: record ", k, " holds elements [", begin, ", +", numel,
            ") of ", ParamLabel(param), ", which has ", param_numel));
      }
      values.resize(static_cast<size_t>(numel) * (1 + moments));
      in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
      if (!in) return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " is truncated (record ", k, ")"));
      if (owned.count(param) == 0) {
        ZERO_ASSIGN_OR_RETURN(owned[param], optimizer_->ReadOwned(param));
      }
      for (OptimizerState::OwnedPart& part : owned[param]) {
        const int64_t first = std::max(begin, part.begin), last = std::min(begin + numel, part.begin + part.numel);
        for (int64_t i = first; i < last; ++i) {
          for (int k = 0; k <= moments; ++k) part.values[k * part.numel + (i - part.begin)] = values[k * numel + (i - begin)];
        }
      }
    }
  }
  for (const auto& [param, parts] : owned) ZERO_RETURN_IF_ERROR(optimizer_->WriteOwned(param, parts));
  step_ = meta.step;
  loss_scaler_.set_state(meta.scaler);
  user_data_ = meta.user_data;
  // Every rank now holds the checkpoint's values: nothing to compare at the next iteration.
  std::fill(set_hash_.begin(), set_hash_.end(), 0);
  replicas_synced_ = true;
  // Every rank's full params from the loaded shards.
  if (config_.stage == 3) return RefreshGathered();
  if (config_.stage != 0) return AllGatherParams();
  return absl::OkStatus();
}

}  // namespace zero::runtime
