// Stage 3: params live only as each rank's shard; units are gathered for compute and released,
// prefetched along the gather order recorded over the first optimizer step (every Gather from
// Finalize to the first Step, forward and backward), within max_live_elems.
#include "absl/strings/str_cat.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {
Status EngineImpl::SetupUnits() {
  const auto& buckets = plan_->buckets();
  units_ = std::vector<Unit>(buckets.size());
  int64_t bytes = 0;
  shard_offset_ = plan_->CompactShardOffsets(/*trainable_only=*/false, &bytes);
  ZERO_ASSIGN_OR_RETURN(params_, allocator_.Allocate(bytes, MemoryCategory::kParams, ops_->placement()));
  ZERO_RETURN_IF_ERROR(ops_->Zero(params_.data(), params_.bytes()));
  // Small units, and params registered without a unit, stay gathered for the whole run.
  for (const partition::Bucket& b : buckets) {
    units_[b.index].persistent = b.unit < 0 || b.numel < config_.stage3.persistence_threshold;
    if (units_[b.index].persistent) {
      ZERO_RETURN_IF_ERROR(StartGather(b.index));
      ZERO_RETURN_IF_ERROR(FinishGather(b.index));
    }
  }
  return absl::OkStatus();
}

StatusOr<int> EngineImpl::BucketOfUnit(int unit, const char* call) const {
  for (const partition::Bucket& b : plan_->buckets()) {
    if (b.unit == unit && unit >= 0) return b.index;
  }
  return absl::NotFoundError(absl::StrCat(call, "(", unit, "): no param was registered with unit ", unit));
}

Status EngineImpl::StartGather(int bucket) {
  const partition::Bucket& b = plan_->buckets()[bucket];
  if (live_elems_ + b.numel > config_.stage3.max_live_elems) ZERO_RETURN_IF_ERROR(DropPrefetched());
  if (live_elems_ + b.numel > config_.stage3.max_live_elems && !units_[bucket].persistent) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "gathering unit ", b.unit, " (", b.numel, " elements) would hold ", live_elems_ + b.numel,
        " gathered elements, above stage3.max_live_elems = ", config_.stage3.max_live_elems,
        "; release units you are done with before gathering more, or raise stage3.max_live_elems"));
  }
  Unit& unit = units_[bucket];
  ZERO_ASSIGN_OR_RETURN(unit.buffer, allocator_.Allocate(b.bytes(), MemoryCategory::kGathered,
                                                         ops_->placement()));
  ZERO_RETURN_IF_ERROR(BeforeCollective());  // the shard may come from kernels still queued
  unit.pending = comm_.AllGather(ShardOf(bucket), unit.buffer.data(), b.shard_numel, b.dtype);
  live_elems_ += b.numel;
  return absl::OkStatus();
}

Status EngineImpl::FinishGather(int bucket) {
  Unit& unit = units_[bucket];
  if (unit.pending == nullptr) return absl::OkStatus();
  Status status = unit.pending->Wait(config_.guard.timeout_s);
  unit.pending.reset();
  if (!status.ok()) {
    return Status(status.code(), absl::StrCat("gathering unit ", plan_->buckets()[bucket].unit, ": ", status.message()));
  }
  return absl::OkStatus();
}

void EngineImpl::FreeUnit(int bucket) {
  units_[bucket].pending.reset();  // abandons an all-gather still in flight before its buffer goes
  units_[bucket].buffer.Reset();
  live_elems_ -= plan_->buckets()[bucket].numel;
}

Status EngineImpl::DropPrefetched() {
  for (const partition::Bucket& b : plan_->buckets()) {
    Unit& unit = units_[b.index];
    if (unit.persistent || unit.holders > 0 || unit.buffer.data() == nullptr) continue;
    ZERO_RETURN_IF_ERROR(FinishGather(b.index));  // MPI may still be writing into it
    FreeUnit(b.index);
    prefetched_elems_ -= b.numel;
  }
  return absl::OkStatus();
}

void EngineImpl::Prefetch() {
  for (size_t k = trace_position_; k < trace_.size(); ++k) {
    const int bucket = trace_[k];
    const partition::Bucket& b = plan_->buckets()[bucket];
    if (units_[bucket].buffer.data() != nullptr) continue;  // held or already on its way
    if (prefetched_elems_ + b.numel > config_.stage3.prefetch_elems ||
        live_elems_ + b.numel > config_.stage3.max_live_elems) {
      return;
    }
    if (!StartGather(bucket).ok()) return;  // on demand later reports the problem
    prefetched_elems_ += b.numel;
  }
}

Status EngineImpl::Gather(int unit) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("Gather"));
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "Gather");
  if (config_.stage != 3) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(SyncReplicas());
  ZERO_ASSIGN_OR_RETURN(int bucket, BucketOfUnit(unit, "Gather"));
  Unit& u = units_[bucket];
  if (u.persistent) return absl::OkStatus();
  // Follow, record or drop the trace of gather order (one optimizer step's gathers).
  if (trace_state_ == Trace::kRecording) {
    trace_.push_back(bucket);
  } else if (trace_state_ == Trace::kValid) {
    if (trace_position_ < trace_.size() && trace_[trace_position_] == bucket) {
      ++trace_position_;
    } else {
      ZERO_LOG(logger_, kInfo) << "stage 3: gather #" << trace_position_ << " of iteration " << iteration_
                               << " is unit " << unit << ", not the recorded unit "
                               << (trace_position_ < trace_.size() ? plan_->buckets()[trace_[trace_position_]].unit : -1)
                               << ": the gather order changed, prefetching stops (gathers are on demand from now on)";
      trace_state_ = Trace::kInvalid;
      ++counters_.trace_invalidations;
      ZERO_RETURN_IF_ERROR(DropPrefetched());
    }
  }
  if (u.buffer.data() != nullptr && u.holders == 0) {  // prefetched before the trainer asked
    ++counters_.gathers_prefetched;
    prefetched_elems_ -= plan_->buckets()[bucket].numel;
  } else if (u.buffer.data() == nullptr) {
    ++counters_.gathers_on_demand;
    ZERO_RETURN_IF_ERROR(StartGather(bucket));
  }
  ZERO_RETURN_IF_ERROR(FinishGather(bucket));
  ++u.holders;
  if (trace_state_ == Trace::kValid) Prefetch();
  return absl::OkStatus();
}

Status EngineImpl::Release(int unit) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("Release"));
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "Release");
  if (config_.stage != 3) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(int bucket, BucketOfUnit(unit, "Release"));
  Unit& u = units_[bucket];
  if (u.persistent) return absl::OkStatus();
  if (u.holders == 0) {
    return absl::FailedPreconditionError(absl::StrCat("Release(", unit, "): unit ", unit, " is not gathered"));
  }
  if (--u.holders == 0) FreeUnit(bucket);
  return absl::OkStatus();
}

Status EngineImpl::RefreshGathered() {
  ZERO_RETURN_IF_ERROR(DropPrefetched());
  // The recorded step's gathers become the trace; every step follows it from the start.
  if (trace_state_ == Trace::kRecording && !trace_.empty()) trace_state_ = Trace::kValid;
  trace_position_ = 0;
  ZERO_RETURN_IF_ERROR(BeforeCollective());  // the step's kernels wrote the shards
  for (const partition::Bucket& b : plan_->buckets()) {
    if (units_[b.index].buffer.data() == nullptr) continue;
    units_[b.index].pending = comm_.AllGather(ShardOf(b.index), units_[b.index].buffer.data(), b.shard_numel, b.dtype);
  }
  for (const partition::Bucket& b : plan_->buckets()) ZERO_RETURN_IF_ERROR(FinishGather(b.index));
  return absl::OkStatus();
}

char* EngineImpl::GatheredParam(int param) {
  const auto& place = plan_->placement(param);
  const Unit& u = units_[place.bucket];
  if (u.buffer.data() == nullptr || (!u.persistent && u.holders == 0)) return nullptr;
  return u.buffer.as<char>() + plan_->ParamByteOffset(param);
}

}  // namespace zero::runtime
