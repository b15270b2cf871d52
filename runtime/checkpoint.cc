// Checkpoints that load at any world size and stage: every rank saves the fp32 weights and
// moments of the param parts it owns, in param coordinates; on load every rank reads, from
// every file's index, the records that overlap the parts it owns now (checkpoint_format.h).
// Frozen params (requires_grad = false) never change: they are saved only under
// checkpoint.save_frozen, as weights without moments (checkpoint_frozen.cc), and a load sets
// those it finds; otherwise a load leaves them as they are.
//
// Saving writes DIR.partial, and every rank's file and meta.json reach stable storage before
// rank 0 swaps it in as DIR in one rename: a crash at any point leaves the previous
// checkpoint whole. A series (SaveCheckpoint(root, tag)) then points root/latest at the new
// tag and deletes the oldest beyond checkpoint.keep_last. Loading checks every field of
// meta.json, every index and every record it reads before it changes anything, and the ranks
// agree that all of them read their part: a damaged checkpoint is an error naming the file,
// and no rank loads anything.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "runtime/checkpoint_files.h"
#include "runtime/checkpoint_format.h"
#include "runtime/checkpoint_series.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {
namespace {

// keep_last deletes only tags that end in a number (step-1000, global_step1000,
// checkpoint-500): a tag such as "best" or "final" is the trainer's to keep.
bool IsNumberedTag(const std::string& tag) { return !tag.empty() && absl::ascii_isdigit(tag.back()); }

// Before rank 0 publishes `partial`: every rank's file is there as that rank wrote it (its
// index checksum is `meta`'s), seen from rank 0. Ranks whose paths name different
// directories (node-local storage) each wrote their file where rank 0 cannot see it.
Status CheckEveryRankFileIsHere(const std::string& partial, const CheckpointMeta& meta) {
  for (int r = 0; r < meta.world; ++r) {
    const StatusOr<std::unique_ptr<RankFileReader>> file = RankFileReader::Open(RankFilePath(partial, r, meta.world),
                                                                                  meta, r);
    if (!file.ok()) {
      return Status(file.status().code(), absl::StrCat(
          "SaveCheckpoint: rank 0 does not find rank ", r, "'s file as that rank wrote it (", file.status().message(),
          "): every rank must save into one directory that all of them share (a node-local path saves each "
          "rank's part on its own node); nothing was published"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Status EngineImpl::AgreeOnOutcome(const Status& local, const std::string& what) {
  // The highest failing rank + 1, or 0 when every rank succeeded.
  float failed = local.ok() ? 0.0f : static_cast<float>(comm_.rank() + 1);
  ZERO_RETURN_IF_ERROR(host_.AllReduce(&failed, 1, comm::ReduceOp::kMax));
  if (!local.ok()) return local;
  if (failed > 0) {
    return absl::AbortedError(absl::StrCat(what, ": rank ", static_cast<int>(failed) - 1,
                                           " failed (its error says why); nothing was changed here"));
  }
  return absl::OkStatus();
}

Status EngineImpl::WriteRankFile(const std::string& path, uint64_t* index_checksum) {
  // Where every rank owns everything (stage 0), rank 0 alone writes it. Records stream to the
  // file (one param's part in memory at a time).
  const bool writes = plan_->ranks_own_shards() || comm_.rank() == 0;
  const bool frozen_too = config_.checkpoint.save_frozen;
  std::vector<RecordExtent> extents;
  for (int p = 0; writes && p < static_cast<int>(specs_.size()); ++p) {
    if (specs_[p].requires_grad) {
      for (const auto& [begin, numel] : optimizer_->OwnedExtents(p)) extents.push_back({p, begin, numel});
    } else if (frozen_too) {
      for (const auto& [begin, numel] : FrozenParts(p, /*loading=*/false)) {
        extents.push_back({p, begin, numel, /*weights_only=*/true});
      }
    }
  }
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<RankFileWriter> out,
                        RankFileWriter::Create(path, extents, optimizer_->state_count()));
  std::vector<float> scratch;
  std::vector<char> staging;
  for (int p = 0; writes && p < static_cast<int>(specs_.size()); ++p) {
    if (specs_[p].requires_grad) {
      ZERO_RETURN_IF_ERROR(optimizer_->VisitOwned(
          p, &scratch, [&](int64_t, int64_t, const float* values) { return out->Append(values); }));
    } else if (frozen_too) {
      for (const auto& [begin, numel] : FrozenParts(p, /*loading=*/false)) {
        ZERO_RETURN_IF_ERROR(ReadFrozenValues(p, begin, numel, &staging, &scratch));
        ZERO_RETURN_IF_ERROR(out->Append(scratch.data()));
      }
    }
  }
  ZERO_RETURN_IF_ERROR(out->Close());
  *index_checksum = out->index_checksum();
  return absl::OkStatus();
}

Status EngineImpl::LockForSave(const std::string& dir, std::optional<DirectoryLock>* lock) {
  // Half of guard.timeout_s, so that the ranks waiting in the next collective hear why.
  ZERO_ASSIGN_OR_RETURN(DirectoryLock locked, DirectoryLock::Acquire(dir, config_.guard.timeout_s / 2));
  if (!locked.unlocked_because().empty()) {
    ZERO_LOG(logger_, kWarn) << "checkpoint: saving without a lock: " << locked.unlocked_because();
  }
  lock->emplace(std::move(locked));
  return absl::OkStatus();
}

namespace {

// The key of `dir` among an engine's series locks: its canonical path.
std::string LockKey(const std::string& dir) {
  std::error_code error;
  std::string key = std::filesystem::weakly_canonical(dir, error).string();
  return error ? dir : key;
}

}  // namespace

Status EngineImpl::HoldSeriesLock(const std::string& root) {
  std::string key = LockKey(root);
  if (series_locks_.count(key) != 0) return absl::OkStatus();
  std::optional<DirectoryLock> lock;
  ZERO_RETURN_IF_ERROR(LockForSave(root, &lock));
  series_locks_.emplace(std::move(key), std::move(*lock));
  return absl::OkStatus();
}

Status EngineImpl::AgreeOnCheckpointDir(const std::string& dir) {
  std::error_code error;
  std::string absolute = std::filesystem::weakly_canonical(std::filesystem::absolute(dir, error), error).string();
  if (error || dir.empty()) absolute = dir;  // compared as written
  absolute = TrimmedDir(absolute);  // "ckpt/." of a directory not made yet canonicalises to "…/ckpt/"
  return AgreeOnBytes(absolute.data(), static_cast<int64_t>(absolute.size()),
                      absl::StrCat("SaveCheckpoint into \"", dir,
                                   "\" (the directory; a path on a file system every rank shares)"));
}

Status EngineImpl::SaveCheckpoint(const std::string& target) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("SaveCheckpoint"));
  ZERO_RETURN_IF_ERROR(AgreeOnCheckpointDir(TrimmedDir(target)));
  return SaveCheckpointAs(target, 0);
}

Status EngineImpl::SaveCheckpointAs(const std::string& target, int64_t series_seq) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("SaveCheckpoint"));
  if (target.empty()) return absl::InvalidArgumentError("SaveCheckpoint: the directory is \"\"; name one");
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "SaveCheckpoint"));
  if (micro_batch_ != 0) {
    return absl::FailedPreconditionError("SaveCheckpoint: micro-batches are pending; call it after Step()");
  }
  std::string dir = TrimmedDir(target);
  std::error_code link_error;
  if (std::filesystem::is_symlink(dir, link_error)) {
    // Save through the link: the checkpoint goes where it points, and the link stays.
    const std::filesystem::path resolved = std::filesystem::weakly_canonical(dir, link_error);
    if (!link_error) dir = resolved.string();
  }
  const std::string partial = dir + ".partial";
  Status created;
  std::optional<DirectoryLock> lock;  // two jobs saving here would mix their rank files
  // A series root this engine saved into is locked already (by this engine). A tag that links
  // elsewhere saves beside its target: that directory is locked for the save.
  if (comm_.rank() == 0 && series_locks_.count(LockKey(ParentOf(dir))) == 0) {
    std::error_code error;
    std::filesystem::create_directories(ParentOf(dir), error);  // its lock needs it; an error shows below
    created = LockForSave(ParentOf(dir), &lock);
  }
  if (comm_.rank() == 0 && created.ok()) created = CheckMetaText(user_data_, "SaveCheckpoint: the user data");
  if (comm_.rank() == 0 && created.ok()) created = RefuseToReplaceOtherData(dir, "SaveCheckpoint");
  if (comm_.rank() == 0 && created.ok()) {  // a fresh DIR.partial (what a crashed save left is discarded)
    std::error_code error;
    std::filesystem::remove_all(partial, error);
    std::filesystem::create_directories(partial, error);
    if (error) created = absl::UnavailableError(absl::StrCat("checkpoint: cannot create ", partial, ": ", error.message()));
  }
  ZERO_RETURN_IF_ERROR(AgreeOnOutcome(created, "SaveCheckpoint"));
  uint64_t index_checksum = 0;
  // A save that fails from here leaves no DIR.partial behind (rank 0 made it, and removes it).
  auto discard_partial = [&](Status failed) {
    std::error_code error;
    if (comm_.rank() == 0) std::filesystem::remove_all(partial, error);
    return failed;
  };
  Status written = WriteRankFile(RankFilePath(partial, comm_.rank(), comm_.size()), &index_checksum);
  if (Status agreed = AgreeOnOutcome(written, "SaveCheckpoint"); !agreed.ok()) return discard_partial(agreed);
  // meta.json names each rank file by its index checksum: a file of another save is refused.
  std::vector<uint64_t> rank_files(static_cast<size_t>(comm_.size()));
  written = host_.AllGather(&index_checksum, rank_files.data(), 1, DType::kInt64);
  if (written.ok() && comm_.rank() == 0) {
    CheckpointMeta meta;
    meta.world = comm_.size();
    meta.stage = config_.stage;
    meta.step = step_;
    meta.series_seq = series_seq;
    meta.optimizer = OptimizerTypeName(config_.optimizer.type);
    meta.moments = optimizer_->state_count();
    meta.user_data = user_data_;
    meta.scaler = loss_scaler_.state();
    meta.groups = groups_;
    meta.rank_files = std::move(rank_files);
    for (size_t p = 0; p < specs_.size(); ++p) {
      const ParamSpec& s = specs_[p];
      const bool saved = s.requires_grad || config_.checkpoint.save_frozen;
      meta.params.push_back({s.name, s.shape, DTypeName(s.dtype), s.requires_grad, saved, plan_->params()[p].numel,
                             param_steps_[p], s.requires_grad ? s.group : -1, aliases_[p]});
    }
    meta.format = FormatFor(meta);
    written = CheckEveryRankFileIsHere(partial, meta);
    if (written.ok()) {
      StatusOr<std::string> text = CheckpointMetaJson(meta);
      written = text.ok() ? WriteFileDurably(partial + "/meta.json", *text) : text.status();
    }
  }
  // Every rank's file is durable: rank 0 makes the whole directory visible at once.
  if (Status agreed = AgreeOnOutcome(written, "SaveCheckpoint"); !agreed.ok()) return discard_partial(agreed);
  Status published = comm_.rank() == 0 ? PublishDirectory(partial, dir) : absl::OkStatus();
  // Nobody reads the checkpoint before it is in place.
  return AgreeOnOutcome(published, "SaveCheckpoint");
}

Status EngineImpl::SaveCheckpoint(const std::string& root_dir, const std::string& tag) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("SaveCheckpoint"));
  const std::string root = TrimmedDir(root_dir);
  ZERO_RETURN_IF_ERROR(AgreeOnCheckpointDir(root + "/" + tag));  // before a refusal of one rank's tag
  const bool printable = std::all_of(tag.begin(), tag.end(), [](char c) { return c >= 0x20 && c != 0x7f; });
  if (tag.empty() || !printable || tag.find('/') != std::string::npos || tag == "." || tag == ".." ||
      tag == "latest" || tag.size() > 200 || (tag.size() > 8 && tag.compare(tag.size() - 8, 8, ".partial") == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("SaveCheckpoint: tag \"", absl::CHexEscape(tag),
                                                   "\" must be a plain file name (printable, no '/', not "
                                                   "\"latest\", not ending in .partial)"));
  }
  Status created;
  if (comm_.rank() == 0) {
    std::error_code error;
    std::filesystem::create_directories(root, error);
    if (error) created = absl::UnavailableError(absl::StrCat("checkpoint: cannot create ", root, ": ", error.message()));
  }
  // The series is one job's from its first save into it until its engine goes: two jobs
  // saving the same tags into one root would replace each other's checkpoints.
  if (comm_.rank() == 0 && created.ok()) created = HoldSeriesLock(root);
  ZERO_RETURN_IF_ERROR(AgreeOnOutcome(created, "SaveCheckpoint"));
  // Only rank 0 writes meta.json, so only its view of the series matters.
  int64_t series_seq = 1;
  if (comm_.rank() == 0) {
    for (const SeriesEntry& entry : SeriesCheckpoints(root)) series_seq = std::max(series_seq, entry.series_seq + 1);
  }
  ZERO_RETURN_IF_ERROR(SaveCheckpointAs(root + "/" + tag, series_seq));
  Status pointed;
  if (comm_.rank() == 0) {
    // `latest` switches only now that the new checkpoint is complete; older ones go after it:
    // the oldest saves of numbered tags beyond keep_last (the new one counts as one of them).
    pointed = ReplaceFileAtomically(root + "/latest", tag + "\n");
    const int keep = config_.checkpoint.keep_last;
    if (pointed.ok() && keep > 0) {
      std::vector<std::string> numbered;
      for (const SeriesEntry& entry : SeriesCheckpoints(root)) {
        if (entry.tag != tag && IsNumberedTag(entry.tag)) numbered.push_back(entry.tag);
      }
      std::error_code error;
      const size_t kept = static_cast<size_t>(keep) - (IsNumberedTag(tag) ? 1 : 0);  // the new one counts
      for (size_t i = 0; i + kept < numbered.size(); ++i) {
        std::filesystem::remove_all(root + "/" + numbered[i], error);
        if (error) {
          ZERO_LOG(logger_, kWarn) << "checkpoint: cannot delete " << root << "/" << numbered[i] << ": "
                                   << error.message();
        }
      }
    }
  }
  return AgreeOnOutcome(pointed, "SaveCheckpoint");
}

StatusOr<std::vector<int>> EngineImpl::MatchCheckpointParams(const CheckpointMeta& meta) const {
  const auto& params = meta.params;
  std::map<std::string, int> registered_by_name;
  std::vector<int> trainable;  // registered trainable params, in order
  for (size_t p = 0; p < specs_.size(); ++p) {
    registered_by_name[specs_[p].name] = static_cast<int>(p);
    if (specs_[p].requires_grad) trainable.push_back(static_cast<int>(p));
  }
  // A param frozen on one side and trainable on the other, named before the trainable params
  // are matched by position (which it would shift, and so be named as another param).
  for (size_t c = 0; c < params.size(); ++c) {
    const auto found = registered_by_name.find(params[c].name);
    if (found == registered_by_name.end() || params[c].requires_grad == specs_[found->second].requires_grad) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint param ", c, " \"", params[c].name, "\" was ", params[c].requires_grad ? "trainable" : "frozen",
        " when saved but ", ParamLabel(found->second), " is registered ",
        specs_[found->second].requires_grad ? "trainable" : "frozen",
        " (a checkpoint keeps optimizer state for its trainable params only): freeze the same params as the "
        "run that saved it, or, to go on from its weights with other params frozen, load the weights alone "
        "(zerort.torch and DeepSpeed: load_checkpoint(dir, load_module_only=True))"));
  }
  std::vector<int> registered(params.size(), -1);
  size_t next = 0;  // the next registered trainable param to match
  for (size_t c = 0; c < params.size(); ++c) {
    const auto found = registered_by_name.find(params[c].name);
    const int same_name = found == registered_by_name.end() ? -1 : found->second;
    if (!params[c].requires_grad && (same_name < 0 || !specs_[same_name].requires_grad)) {
      // Frozen on both sides (or not registered): its records, if saved, set the registered one.
      if (same_name >= 0 && params[c].saved && params[c].shape != specs_[same_name].shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint holds frozen param ", c, " \"", params[c].name, "\" with shape [",
            absl::StrJoin(params[c].shape, ", "), "] but ", ParamLabel(same_name), " is registered with shape [",
            absl::StrJoin(specs_[same_name].shape, ", "), "]"));
      }
      registered[c] = same_name;
      continue;
    }
    if (next == trainable.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint has more trainable params than the ", trainable.size(), " registered: \"", params[c].name,
          "\" (checkpoint param ", c, ") is in the checkpoint only"));
    }
    const int p = trainable[next++];
    const ParamSpec& s = specs_[p];
    if (params[c].name != s.name || params[c].shape != s.shape || params[c].dtype != DTypeName(s.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint param ", c, " is \"", params[c].name, "\" [", absl::StrJoin(params[c].shape, ", "), "] ",
          params[c].dtype, " but ", ParamLabel(p), " is registered with shape [", absl::StrJoin(s.shape, ", "), "] ",
          DTypeName(s.dtype)));
    }
    registered[c] = p;
  }
  if (next != trainable.size()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint has ", next, " trainable params, ", trainable.size(),
                                                   " are registered: ", ParamLabel(trainable[next]),
                                                   " is not in the checkpoint"));
  }
  const std::string optimizer = OptimizerTypeName(config_.optimizer.type);
  if (meta.optimizer != optimizer) {
    // Adam, AdamW and LAMB keep the same two moments (exp_avg, exp_avg_sq): switching among
    // them on resume is a choice; the others' state means something else.
    auto adam_like = [](const std::string& type) { return type == "adam" || type == "adamw" || type == "lamb"; };
    if (!adam_like(meta.optimizer) || !adam_like(optimizer)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint was written by optimizer \"", meta.optimizer, "\" but this engine's is \"", optimizer,
          "\": its optimizer state would be read as another optimizer's; set optimizer.type to \"",
          meta.optimizer, "\""));
    }
    ZERO_LOG(logger_, kWarn) << "checkpoint was written by optimizer \"" << meta.optimizer
                             << "\"; continuing with \"" << optimizer << "\" on its moments";
  }
  if (!meta.groups.empty() && static_cast<int>(meta.groups.size()) != num_groups()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint has ", meta.groups.size(), " optimizer groups but this engine has ", num_groups(),
        ": register the params in the same groups (ParamSpec::group; model_parameters in "
        "zerort.torch) and the same optimizer.param_groups as the run that saved it"));
  }
  for (size_t c = 0; c < params.size(); ++c) {  // same count, same membership
    const int p = registered[c];
    if (p < 0 || params[c].group < 0 || params[c].group == specs_[p].group) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint param ", c, " \"", params[c].name, "\" was in optimizer group ", params[c].group,
        " when saved but ", ParamLabel(p), " is registered in group ", specs_[p].group,
        ": the groups' hyperparameters (lr, weight_decay, ...) would go to other params. Register the params in "
        "the same groups, listed in the same order (ParamSpec::group; model_parameters in zerort.torch), as the "
        "run that saved it"));
  }
  // SGD built without momentum adds its buffer to load one (LoadCheckpoint).
  const bool adds_momentum = config_.optimizer.type == OptimizerType::kSgd && meta.moments == 1;
  if (meta.moments != optimizer_->state_count() && !adds_momentum) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint was written by optimizer \"", meta.optimizer,
                                                   "\" with ", meta.moments, " moment buffer(s); this engine's \"",
                                                   OptimizerTypeName(config_.optimizer.type), "\" keeps ",
                                                   optimizer_->state_count()));
  }
  return registered;
}

StatusOr<EngineImpl::CheckpointShard> EngineImpl::ReadCheckpointShard(const std::string& dir,
                                                                    const CheckpointMeta& meta,
                                                                    const std::vector<int>& registered) {
  // Host copies of the parts this rank loads, filled from the records that overlap them:
  // owned parts of trainable params, and parts of the frozen params the checkpoint saved.
  CheckpointShard shard;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> extents(specs_.size());
  for (size_t p = 0; p < specs_.size(); ++p) {
    if (specs_[p].requires_grad) extents[p] = optimizer_->OwnedExtents(static_cast<int>(p));
  }
  for (size_t c = 0; c < meta.params.size(); ++c) {
    const int p = registered[c];
    if (p >= 0 && !specs_[p].requires_grad && meta.params[c].saved) {
      extents[p] = FrozenParts(p, /*loading=*/true);
      for (const auto& [begin, numel] : extents[p]) shard.frozen[p].push_back({begin, numel, {}});
    }
  }
  const int moments = meta.moments;
  // Per param and extent: the spans the records covered, which must tile it exactly.
  std::vector<std::vector<std::vector<std::pair<int64_t, int64_t>>>> covered(specs_.size());
  for (size_t p = 0; p < specs_.size(); ++p) covered[p].resize(extents[p].size());
  std::vector<float> values;
  for (int q = 0; q < meta.world; ++q) {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<RankFileReader> file,
                          RankFileReader::Open(RankFilePath(dir, q, meta.world), meta, q));
    for (size_t k = 0; k < file->records().size(); ++k) {
      const RankFileReader::Record& r = file->records()[k];
      const int param = registered[r.param];  // trainable params have records: all matched
      if (param < 0) continue;  // a frozen param saved but not registered here
      const int64_t end = r.begin + r.numel;
      const auto& mine = extents[param];
      bool overlaps = false;
      for (size_t i = 0; i < mine.size(); ++i) {
        const int64_t first = std::max(mine[i].first, r.begin), last = std::min(mine[i].first + mine[i].second, end);
        if (first < last) covered[param][i].emplace_back(first, last);
        overlaps = overlaps || first < last;
      }
      if (!overlaps) continue;  // not read at all
      ZERO_RETURN_IF_ERROR(file->Read(k, &values));
      if (!specs_[param].requires_grad) {
        for (FrozenPart& part : shard.frozen[param]) {
          const int64_t first = std::max(r.begin, part.begin), last = std::min(end, part.begin + part.numel);
          if (first < last) NarrowIntoFrozenPart(param, &values[first - r.begin], first, last - first, &part);
        }
        continue;
      }
      if (shard.trainable.count(param) == 0) {
        ZERO_ASSIGN_OR_RETURN(shard.trainable[param], optimizer_->ReadOwned(param));
      }
      for (OptimizerState::OwnedPart& part : shard.trainable[param]) {
        const int64_t first = std::max(r.begin, part.begin), last = std::min(end, part.begin + part.numel);
        for (int m = 0; m <= moments && first < last; ++m) {
          std::memcpy(&part.values[m * part.numel + (first - part.begin)], &values[m * r.numel + (first - r.begin)],
                      static_cast<size_t>(last - first) * sizeof(float));
        }
      }
    }
    counters_.checkpoint_bytes_read += file->bytes_read();
  }
  for (size_t p = 0; p < specs_.size(); ++p) {
    for (size_t i = 0; i < extents[p].size(); ++i) {
      const auto& [begin, numel] = extents[p][i];
      ZERO_RETURN_IF_ERROR(CheckTiling(std::move(covered[p][i]), begin, begin + numel, ParamLabel(static_cast<int>(p))));
    }
  }
  return shard;
}

Status EngineImpl::LoadCheckpoint(const std::string& target) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("LoadCheckpoint"));
  ZERO_RETURN_IF_ERROR(RequireFinishableIteration("LoadCheckpoint"));  // a load would not make it so
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "LoadCheckpoint"));
  if (micro_batch_ != 0) return absl::FailedPreconditionError("LoadCheckpoint: micro-batches are pending");
  if (target.empty()) return absl::InvalidArgumentError("LoadCheckpoint: the directory is \"\"; name one");
  // Every rank reads its part; nothing changes unless every rank succeeded.
  StatusOr<CheckpointShard> shard;
  StatusOr<CheckpointMeta> meta;
  StatusOr<std::vector<int>> registered;
  StatusOr<std::string> dir = ResolveCheckpointDir(target);
  if (dir.ok()) meta = ReadCheckpointMeta(*dir);
  if (meta.ok()) registered = MatchCheckpointParams(*meta);
  Status read = !dir.ok() ? dir.status() : !meta.ok() ? meta.status() : registered.status();
  // SGD built without momentum: a run that turned it on later saved its buffer, read into the
  // one added here (if the load fails it stays, as zeros that no step reads before a param's
  // first step with momentum, which starts it from the gradient).
  if (read.ok() && meta->moments == 1) read = optimizer_->AddMomentumBuffer();
  if (read.ok()) {
    shard = ReadCheckpointShard(*dir, *meta, *registered);
    read = shard.status();
  }
  ZERO_RETURN_IF_ERROR(AgreeOnOutcome(read, "LoadCheckpoint"));
  Status written;
  for (const auto& [param, parts] : shard->trainable) written.Update(optimizer_->WriteOwned(param, parts));
  for (const auto& [param, parts] : shard->frozen) {
    for (const FrozenPart& part : parts) written.Update(WriteFrozenValues(param, part));
  }
  // A rank that could not write its part (a device error) must not leave the others waiting
  // in the gather below.
  ZERO_RETURN_IF_ERROR(AgreeOnOutcome(written, "LoadCheckpoint"));
  std::vector<std::string> not_loaded;  // saved frozen params this engine does not keep
  for (size_t c = 0; c < meta->params.size(); ++c) {
    if (meta->params[c].saved && (*registered)[c] < 0) not_loaded.push_back(meta->params[c].name);
  }
  if (!not_loaded.empty()) {
    ZERO_LOG(logger_, kWarn) << "LoadCheckpoint: " << not_loaded.size() << " frozen param(s) the checkpoint holds "
                             << "are not registered here and were not loaded (first: \"" << not_loaded[0]
                             << "\"); register them (requires_grad = false) to load them";
  }
  step_ = meta->step;
  for (size_t c = 0; c < meta->params.size(); ++c) {
    if ((*registered)[c] >= 0) param_steps_[(*registered)[c]] = meta->params[c].steps;
  }
  if (!meta->groups.empty()) groups_ = meta->groups;
  ApplySchedule();  // a schedule's position is the checkpoint's step
  loss_scaler_.Restore(meta->scaler);
  user_data_ = meta->user_data;
  // Every rank now holds the checkpoint's values: nothing to compare at the next iteration.
  replicas_synced_ = true;
  return params_->AfterLoad();  // every rank's view from the loaded shards
}

}  // namespace zero::runtime
