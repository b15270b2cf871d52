// Replicas that cannot drift: before the first iteration every rank's params are made equal to
// rank 0's (guard.init_params = "broadcast", as DDP and DeepSpeed do when they wrap a model) or
// checked equal ("verify"), and with guard.replica_check_every = N the ranks compare a hash of
// their params every N steps. Stage 3 keeps no replicas (each rank holds its shard), so there
// the values each rank passed to SetParam are compared instead, and cannot be repaired.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {
namespace {

constexpr int64_t kHashChunkBytes = 16 << 20;  // device params are hashed through host chunks
constexpr uint64_t kHashSeed = 0x9E3779B97F4A7C15ull;

// A fast 64-bit hash of bytes (8 bytes per multiply), continuing from `hash`.
uint64_t HashBytes(uint64_t hash, const char* data, int64_t bytes) {
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t word;
    std::memcpy(&word, data + i, 8);
    hash = (hash ^ word) * 0xFF51AFD7ED558CCDull;
    hash ^= hash >> 29;
  }
  for (; i < bytes; ++i) hash = (hash ^ static_cast<unsigned char>(data[i])) * 0x100000001B3ull;
  return hash;
}

}  // namespace

StatusOr<uint64_t> EngineImpl::HashValues(const void* values, int64_t bytes) {
  if (PlacementOf(values) != Placement::kDevice) {
    return HashBytes(kHashSeed, static_cast<const char*>(values), bytes);
  }
  if (replica_staging_.bytes() < std::min(bytes, kHashChunkBytes)) {
    replica_staging_.Reset();
    ZERO_ASSIGN_OR_RETURN(replica_staging_, allocator_.Allocate(std::min(bytes, kHashChunkBytes),
                                                                MemoryCategory::kWorkspace, Placement::kHost));
  }
  uint64_t hash = kHashSeed;
  for (int64_t done = 0; done < bytes; done += kHashChunkBytes) {
    const int64_t chunk = std::min(kHashChunkBytes, bytes - done);
    ZERO_RETURN_IF_ERROR(ops_->Copy(replica_staging_.data(), static_cast<const char*>(values) + done, chunk));
    hash = HashBytes(hash, replica_staging_.as<char>(), chunk);
  }
  return hash;
}

StatusOr<std::vector<int>> EngineImpl::ParamsDifferingFromRank0(std::vector<int>* ranks_of_first) {
  const int world = comm_.size();
  std::vector<uint64_t> mine(specs_.size(), 0);
  for (size_t p = 0; p < specs_.size(); ++p) {
    if (config_.stage == 3) {
      mine[p] = set_hash_[p];
    } else {
      ZERO_ASSIGN_OR_RETURN(mine[p], HashValues(ParamAddress(static_cast<int>(p)), ParamBytes(static_cast<int>(p))));
    }
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
  if (replicas_synced_ || comm_.size() == 1) {
    replicas_synced_ = true;
    return absl::OkStatus();
  }
  ZERO_RETURN_IF_ERROR(BeforeCollective());  // SetParam may have queued copies on the stream
  std::vector<int> ranks;
  ZERO_ASSIGN_OR_RETURN(std::vector<int> differing, ParamsDifferingFromRank0(&ranks));
  if (differing.empty()) {
    replicas_synced_ = true;
    return absl::OkStatus();
  }
  const std::string first = absl::StrCat(ParamLabel(differing.front()), " on rank(s) ", absl::StrJoin(ranks, ", "));
  if (config_.stage == 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ranks passed different initial values to SetParam for ", differing.size(), " param(s); first: ",
        first, " differs from rank 0. At stage 3 each rank keeps only its own shard of the values it was "
        "given, so the replicas cannot be repaired afterwards: give every rank the same values (seed the "
        "initialisation identically on every rank)"));
  }
  if (config_.guard.init_params == InitParams::kVerify) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ranks' initial params differ for ", differing.size(), " param(s); first: ", first,
        " differs from rank 0 (guard.init_params = \"verify\"). Seed the initialisation identically on "
        "every rank, or let ZeroRT broadcast rank 0's values with guard.init_params = \"broadcast\""));
  }
  for (int p : differing) {
    const auto& bucket = plan_->buckets()[plan_->placement(p).bucket];
    Status sent = comm_.Broadcast(ParamAddress(p), plan_->placement(p).numel, bucket.dtype, 0)->Wait(config_.guard.timeout_s);
    if (!sent.ok()) return Status(sent.code(), absl::StrCat("broadcasting rank 0's initial ", ParamLabel(p), ": ", sent.message()));
    ZERO_RETURN_IF_ERROR(optimizer_->RefreshMaster(p));
  }
  ZERO_LOG(logger_, kInfo) << differing.size() << " param(s) differed from rank 0's at the first iteration "
                           << "(first: " << first << "); rank 0's values were broadcast";
  replicas_synced_ = true;
  return absl::OkStatus();
}

Status EngineImpl::CheckReplicasAgree() {
  if (config_.guard.replica_check_every <= 0 || config_.stage == 3 || comm_.size() == 1 ||
      step_ % config_.guard.replica_check_every != 0) {
    return absl::OkStatus();
  }
  ZERO_RETURN_IF_ERROR(BeforeCollective());
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
