// Checkpoints that load at any world size and stage: every rank saves the fp32 weights and
// moments of the param parts it owns, in param coordinates; on load every rank takes, from
// every file, what falls inside the parts it owns now.
//
//   DIR/meta.json            format, world, stage, step, optimizer, moment count, loss scaler,
//                            and each param's name, shape and dtype (rank 0 writes it)
// Frozen params (requires_grad = false) are not saved: they never change; set them again with
// SetParam after loading.
//
//   DIR/rank-R-of-N.bin      "ZRTCKPT1", record count, then records of
//                            {int32 param, int64 param_begin, int64 numel, float master[numel],
//                             float moment[numel] per moment buffer}
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {
namespace {

constexpr char kMagic[8] = {'Z', 'R', 'T', 'C', 'K', 'P', 'T', '1'};

std::string RankFile(const std::string& dir, int rank, int world) {
  return absl::StrCat(dir, "/rank-", rank, "-of-", world, ".bin");
}

Status IoError(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat("checkpoint: cannot ", what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

Status EngineImpl::SaveCheckpoint(const std::string& dir) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("SaveCheckpoint"));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "SaveCheckpoint"));
  if (micro_batch_ != 0) {
    return absl::FailedPreconditionError("SaveCheckpoint: micro-batches are pending; call it after Step()");
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::UnavailableError(absl::StrCat("checkpoint: cannot create ", dir, ": ", error.message()));
  // Stage 0 ranks all own everything: rank 0 alone writes it.
  const bool writes = config_.stage != 0 || comm_.rank() == 0;
  const std::string path = RankFile(dir, comm_.rank(), comm_.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return IoError("write", path);
  std::vector<char> body;
  int64_t records = 0;
  auto put = [&body](const void* data, size_t bytes) {
    body.insert(body.end(), static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  };
  for (size_t p = 0; writes && p < specs_.size(); ++p) {
    if (!specs_[p].requires_grad) continue;
    ZERO_ASSIGN_OR_RETURN(std::vector<OptimizerState::OwnedPart> parts, optimizer_->ReadOwned(static_cast<int>(p)));
    for (const OptimizerState::OwnedPart& part : parts) {
      const int32_t param = static_cast<int32_t>(p);
      put(&param, sizeof param);
      put(&part.begin, sizeof part.begin);
      put(&part.numel, sizeof part.numel);
      put(part.values.data(), part.values.size() * sizeof(float));  // weights, then each moment
      ++records;
    }
  }
  out.write(kMagic, sizeof kMagic);
  out.write(reinterpret_cast<const char*>(&records), sizeof records);
  out.write(body.data(), static_cast<std::streamsize>(body.size()));
  out.close();
  if (!out) return IoError("write", path);
  if (comm_.rank() == 0) {
    nlohmann::json meta;
    meta["format"] = 1;
    meta["world"] = comm_.size();
    meta["stage"] = config_.stage;
    meta["step"] = step_;
    meta["optimizer"] = OptimizerTypeName(config_.optimizer.type);
    meta["moments"] = optimizer_->state_count();
    const LossScaler::State scaler = loss_scaler_.state();
    meta["loss_scaler"] = {{"scale", scaler.scale}, {"remaining_hysteresis", scaler.remaining_hysteresis},
                           {"iteration", scaler.iteration}, {"last_overflow", scaler.last_overflow}};
    for (const ParamSpec& s : specs_) {
      meta["params"].push_back({{"name", s.name}, {"shape", s.shape}, {"dtype", DTypeName(s.dtype)},
                                {"requires_grad", s.requires_grad}});
    }
    std::ofstream file(dir + "/meta.json");
    file << meta.dump(1) << "\n";
    if (!file) return IoError("write", dir + "/meta.json");
  }
  // Nobody reads a checkpoint before every rank has written its part.
  return comm_.Barrier()->Wait(config_.guard.timeout_s);
}

Status EngineImpl::LoadCheckpoint(const std::string& dir) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("LoadCheckpoint"));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "LoadCheckpoint"));
  if (micro_batch_ != 0) return absl::FailedPreconditionError("LoadCheckpoint: micro-batches are pending");
  std::ifstream meta_file(dir + "/meta.json");
  if (!meta_file) return IoError("read", dir + "/meta.json");
  const nlohmann::json meta = nlohmann::json::parse(meta_file, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.contains("params") || meta.value("format", 0) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", dir, "/meta.json is not a ZeroRT checkpoint"));
  }
  const auto& params = meta["params"];
  for (size_t p = 0; p < std::min(specs_.size(), params.size()); ++p) {
    const ParamSpec& s = specs_[p];
    if (!params[p].is_object() || !params[p].contains("shape") || !params[p]["shape"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: param ", p, " in meta.json has no shape"));
    }
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
  const int moments = meta.value("moments", -1);
  if (moments != optimizer_->state_count()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint was written by optimizer \"", meta.value("optimizer", "?"),
                                                   "\" with ", moments, " moment buffer(s); this engine's \"",
                                                   OptimizerTypeName(config_.optimizer.type), "\" keeps ",
                                                   optimizer_->state_count()));
  }
  // Take from every saved part what overlaps the parts this rank owns now, in host copies of
  // those parts, then write them back.
  const int saved_world = meta.value("world", 0);
  std::vector<float> values;
  std::map<int, std::vector<OptimizerState::OwnedPart>> owned;
  for (int q = 0; q < saved_world; ++q) {
    const std::string path = RankFile(dir, q, saved_world);
    std::ifstream in(path, std::ios::binary);
    if (!in) return IoError("read", path);
    char magic[sizeof kMagic];
    int64_t records = 0;
    in.read(magic, sizeof magic);
    in.read(reinterpret_cast<char*>(&records), sizeof records);
    if (!in || std::memcmp(magic, kMagic, sizeof kMagic) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " is not a ZeroRT rank file"));
    }
    for (int64_t k = 0; k < records; ++k) {
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
  step_ = meta.value("step", int64_t{0});
  const auto& scaler = meta["loss_scaler"];
  loss_scaler_.set_state({scaler.value("scale", 1.0f), scaler.value("remaining_hysteresis", 1),
                          scaler.value("iteration", int64_t{0}), scaler.value("last_overflow", int64_t{-1})});
  // Every rank now holds the checkpoint's values: nothing to compare at the next iteration.
  std::fill(set_hash_.begin(), set_hash_.end(), 0);
  replicas_synced_ = true;
  // Every rank's full params from the loaded shards.
  if (config_.stage == 3) return RefreshGathered();
  if (config_.stage != 0) return AllGatherParams();
  return absl::OkStatus();
}

}  // namespace zero::runtime
