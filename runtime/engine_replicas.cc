// Replicas that cannot drift: before the first iteration every rank's params are made equal to
// rank 0's (guard.init_params = "broadcast", as DDP and DeepSpeed do when they wrap a model) or
// checked equal ("verify"), and with guard.replica_check_every = N the ranks compare a hash of
// their params every N steps. Stage 3 keeps no replicas (each rank holds its shard), so there
// the values each rank passed to SetParam are compared instead, and cannot be repaired.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {

StatusOr<std::vector<int>> EngineImpl::ParamsDifferingFromRank0(std::vector<int>* ranks_of_first) {
  const int world = comm_.size();
  std::vector<uint64_t> mine(specs_.size(), 0);
  for (size_t p = 0; p < specs_.size(); ++p) {
    ZERO_ASSIGN_OR_RETURN(mine[p], params_->ReplicaHash(static_cast<int>(p)));
  }
  // The hashes' bit patterns travel as int64 elements.
  std::vector<uint64_t> all(mine.size() * world, 0);
  ZERO_RETURN_IF_ERROR(host_.AllGather(mine.data(), all.data(), static_cast<int64_t>(mine.size()), DType::kInt64));
  std::vector<int> differing;
  for (size_t p = 0; p < mine.size(); ++p) {
    std::vector<int> ranks;
    for (int r = 1; r < world; ++r) {
      if (all[r * mine.size() + p] != all[p]) ranks.push_back(r);
    }
    if (ranks.empty()) continue;
    if (differing.empty()) *ranks_of_first = ranks;
    differing.push_back(static_cast<int>(p));
  }
  return differing;
}

Status EngineImpl::SyncReplicas() {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("SyncReplicas"));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "SyncReplicas"));
  if (micro_batch_ != 0) return absl::FailedPreconditionError("SyncReplicas: micro-batches of a step are pending");
  replicas_synced_ = false;
  ZERO_RETURN_IF_ERROR(SyncReplicasOnce());
  // With replicas, the first iteration compares them again (writes into the views since).
  if (params_->holds_replicas()) replicas_synced_ = false;
  return absl::OkStatus();
}

Status EngineImpl::SyncReplicasOnce() {
  if (replicas_synced_ || comm_.size() == 1) {
    replicas_synced_ = true;
    return absl::OkStatus();
  }
  ZERO_RETURN_IF_ERROR(path_.MakeStreamWorkVisible());  // SetParam may have queued copies on the stream
  std::vector<int> ranks;
  ZERO_ASSIGN_OR_RETURN(std::vector<int> differing, ParamsDifferingFromRank0(&ranks));
  if (differing.empty()) {
    replicas_synced_ = true;
    return absl::OkStatus();
  }
  const std::string first = absl::StrCat(ParamLabel(differing.front()), " on rank(s) ", absl::StrJoin(ranks, ", "));
  if (!params_->holds_replicas()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ranks passed different values to SetParam (a param's initial values) or SetFullState for ",
        differing.size(), " param(s); first: ", first, " differs from rank 0. At stage 3 each rank keeps only its "
        "own shard of the values it was given, so the replicas cannot be repaired afterwards: give every rank "
        "the same values (seed the initialisation identically on every rank)"));
  }
  if (config_.guard.init_params == InitParams::kVerify) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ranks' initial params differ for ", differing.size(), " param(s); first: ", first,
        " differs from rank 0 (guard.init_params = \"verify\"). Seed the initialisation identically on "
        "every rank, or let ZeroRT broadcast rank 0's values with guard.init_params = \"broadcast\""));
  }
  for (int p : differing) {
    ZERO_RETURN_IF_ERROR(params_->BroadcastFromRank0(p));
    ZERO_RETURN_IF_ERROR(optimizer_->RefreshMaster(p));
  }
  ZERO_LOG(logger_, kInfo) << differing.size() << " param(s) differed from rank 0's at the first iteration "
                           << "(first: " << first << "); rank 0's values were broadcast";
  replicas_synced_ = true;
  return absl::OkStatus();
}

Status EngineImpl::CheckReplicasAgree() {
  if (config_.guard.replica_check_every <= 0 || !params_->holds_replicas() || comm_.size() == 1 ||
      step_ % config_.guard.replica_check_every != 0) {
    return absl::OkStatus();
  }
  ZERO_RETURN_IF_ERROR(path_.MakeStreamWorkVisible());
  std::vector<int> ranks;
  ZERO_ASSIGN_OR_RETURN(std::vector<int> differing, ParamsDifferingFromRank0(&ranks));
  if (differing.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "after step ", step_, " the replicas differ: ", differing.size(), " param(s), first ",
      ParamLabel(differing.front()), " on rank(s) ", absl::StrJoin(ranks, ", "), " differs from rank 0 "
      "(guard.replica_check_every). Something wrote into the engine's params outside the protocol (a "
      "ParamData view written on one rank, a SetParam on some ranks only); resume from the last checkpoint"));
}

}  // namespace zero::runtime
