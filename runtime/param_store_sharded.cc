// Stage 3: params live only as each rank's shard; units are gathered for compute and released,
// into the engine's buffers or into memory the trainer lends (LendGatheredMemory),
// prefetched along the gather order recorded over the first optimizer step (every Gather from
// Finalize to the first Step, forward and backward), keeping and prefetching within
// stage3.max_live_elems (a gather the trainer asks for goes beyond it if it must). A gather
// off the recorded order leaves the trace (on demand from there) until a gather of the trace's
// first unit starts a pass from the top again: an eval pass's forward follows the trace's first
// gathers, and the training step after it comes back to the trace at its first gather. A step
// that never comes back (changed control flow) has the next step record the order again. A
// unit released at the end of a forward whose backward follows (Engine::ReleaseUntilBackward),
// where the order gathers it again within stage3.max_reuse_elems (DeepSpeed's
// stage3_max_reuse_distance), stays gathered: freeing it would only have it gathered straight
// back. Any other release (a trainer's own look at the params, which may write into them)
// frees. Prefetches stop at the end of the micro-batch (as recorded): within a backward, units
// are released as their gradients arrive, which on ranks whose forwards reached different
// params (a param used on some ranks only) comes at different points, so whether a unit the
// next micro-batch's forward gathers is still held differs between ranks, and so would a
// prefetch of it (an all-gather some ranks make and others do not).
#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/param_store.h"
#include "runtime/replica_hash.h"

namespace zero::runtime {
namespace {

using partition::Bucket;

class ShardedParams final : public ParamStore {
 public:
  ShardedParams(const Context& context, base::Buffer shards, std::vector<int64_t> shard_offsets)
      : config_(context.config.stage3), plan_(context.plan), path_(context.path), allocator_(context.allocator),
        ops_(context.ops), logger_(context.logger), counters_(context.counters), shards_(std::move(shards)),
        shard_offset_(std::move(shard_offsets)), units_(plan_.buckets().size()),
        set_hash_(plan_.params().size(), 0), hasher_(context.ops, context.allocator) {}

  // Gathers still in flight are abandoned before their buffers are freed.
  ~ShardedParams() override {
    for (Unit& unit : units_) unit.pending.reset();
  }

  // Small units, and params registered without a unit, stay gathered for the whole run.
  Status GatherPersistentUnits() {
    for (const Bucket& b : plan_.buckets()) {
      units_[b.index].persistent = b.unit < 0 || b.numel < config_.persistence_threshold;
      if (!units_[b.index].persistent) continue;
      ZERO_RETURN_IF_ERROR(StartGather(b.index));
      ZERO_RETURN_IF_ERROR(FinishGather(b.index));
    }
    return absl::OkStatus();
  }

  bool holds_replicas() const override { return false; }

  char* Owned(int bucket) override { return shards_.as<char>() + shard_offset_[bucket]; }

  Status Set(int param, const void* values) override {
    ZERO_ASSIGN_OR_RETURN(set_hash_[param], hasher_.Hash(values, plan_.ParamBytes(param)));
    const int64_t element = ElementBytes(param);
    for (const partition::Fragment& f : plan_.FragmentsOfParam(param)) {  // this rank's fragment
      if (f.rank != path_.comm().rank()) continue;
      ZERO_RETURN_IF_ERROR(ops_.Copy(Owned(f.bucket) + f.shard_begin * element,
                                     static_cast<const char*>(values) + f.param_begin * element, f.numel * element));
    }
    const int bucket = plan_.placement(param).bucket;
    ZERO_RETURN_IF_ERROR(FinishGather(bucket));
    if (units_[bucket].buffer.data() == nullptr) return absl::OkStatus();
    return ops_.Copy(units_[bucket].buffer.as<char>() + plan_.ParamByteOffset(param), values, plan_.ParamBytes(param));
  }

  Status Get(int param, void* out) override {
    const int bucket = plan_.placement(param).bucket;
    const bool held = units_[bucket].buffer.data() != nullptr;
    if (!held) ZERO_RETURN_IF_ERROR(StartGather(bucket));
    const Status gathered = FinishGather(bucket);
    if (!gathered.ok()) {
      if (!held) FreeUnit(bucket, /*failed=*/true);
      return gathered;
    }
    const Status copied =
        ops_.Copy(out, units_[bucket].buffer.as<char>() + plan_.ParamByteOffset(param), plan_.ParamBytes(param));
    if (!held) FreeUnit(bucket);
    return copied;
  }

  void* View(int param) override {
    const Unit& u = units_[plan_.placement(param).bucket];
    if (u.buffer.data() == nullptr || (!u.persistent && u.holders == 0)) return nullptr;
    return u.buffer.as<char>() + plan_.ParamByteOffset(param);
  }

  Status Gather(int unit) override;
  Status Release(int unit, bool may_keep) override;

  Status ReleaseUnheld() override {
    const Status dropped = DropPrefetched();
    spares_.clear();
    return dropped;
  }

  StatusOr<GatheredPlace> Place(int param) const override {
    const Bucket& b = plan_.buckets()[plan_.placement(param).bucket];
    GatheredPlace place;
    place.unit = b.unit;
    place.offset_bytes = plan_.ParamByteOffset(param);
    place.unit_bytes = b.bytes();
    place.persistent = units_[b.index].persistent;
    return place;
  }

  Status Lend(GatheredMemoryLender lender) override;

  void ForgetLender() override {
    if (lender_ != nullptr) lender_->lender = GatheredMemoryLender();  // lent buffers give nothing back
    lender_.reset();
  }

  void EndOfMicroBatch() override {
    if (trace_state_ == Trace::kRecording) micro_batch_ends_.push_back(trace_.size());
  }

  // Every gathered unit's buffer gets the new values; the recorded step's gathers become the
  // trace, and every step follows it from the start.
  Status AfterStep(bool) override {
    ZERO_RETURN_IF_ERROR(DropPrefetched());
    if (trace_state_ == Trace::kRecording && !trace_.empty()) trace_state_ = Trace::kValid;
    if (trace_state_ == Trace::kOffTrace) {  // the step never came back: record the next one's
      trace_.clear();
      micro_batch_ends_.clear();
      trace_state_ = Trace::kRecording;
    }
    trace_position_ = 0;
    restarts_.clear();
    for (const Bucket& b : plan_.buckets()) {
      if (units_[b.index].buffer.data() != nullptr) units_[b.index].pending = StartUnitGather(b);
    }
    for (const Bucket& b : plan_.buckets()) ZERO_RETURN_IF_ERROR(FinishGather(b.index));
    return absl::OkStatus();
  }

  Status AfterLoad() override {
    std::fill(set_hash_.begin(), set_hash_.end(), 0);
    return AfterStep(true);
  }

  StatusOr<uint64_t> ReplicaHash(int param) override { return set_hash_[param]; }

  Status BroadcastFromRank0(int) override {
    return absl::FailedPreconditionError("stage 3 keeps no replicas to broadcast into");
  }

  Status WaitForCollectives() override {
    Status first;
    for (size_t b = 0; b < units_.size(); ++b) first.Update(FinishGather(static_cast<int>(b)));
    return first;
  }

 private:
  struct Unit {
    base::Buffer buffer;    // the gathered full bucket, or empty
    comm::WorkPtr pending;  // its all-gather, until waited for
    int holders = 0;        // Gathers not yet Released
    bool persistent = false;
    bool kept = false;      // released until its backward and kept for it (GatheredAgainSoon)
  };
  enum class Trace { kRecording, kValid, kOffTrace };
  // The lender of gathered units' memory, shared with the buffers it lent: stopping the
  // lending empties it, so those buffers give nothing back any more.
  struct LenderSlot {
    GatheredMemoryLender lender;
  };

  int64_t ElementBytes(int param) const { return plan_.buckets()[plan_.placement(param).bucket].element_bytes(); }
  StatusOr<int> BucketOfUnit(int unit, const char* call) const;
  // Where the latest gathers would be in the trace had a pass started from its top since
  // (each gather of the trace's first unit may begin one), after a gather of `bucket`.
  void NoteRestarts(int bucket);
  // Allocates the bucket's buffer within max_live_elems and starts its all-gather.
  Status StartGather(int bucket);
  // The all-gather of `b`'s shards into its unit's buffer (at world size 1, a device copy).
  comm::WorkPtr StartUnitGather(const Bucket& b);
  Status FinishGather(int bucket);
  // Frees the bucket's gathered buffer, or keeps it among the spares (see spares_) unless
  // its all-gather `failed` (MPI may still write into it).
  void FreeUnit(int bucket, bool failed = false);
  // A buffer for `b`'s gathered values: lent by the trainer, a spare of its size, or a new one.
  StatusOr<base::Buffer> TakeBuffer(const Bucket& b);
  StatusOr<base::Buffer> BorrowBuffer(const Bucket& b);
  // Drops the units nobody holds: prefetched ones nobody asked for yet (after their
  // all-gathers complete) and kept ones.
  Status DropPrefetched();
  // Frees kept units, the one the recorded order gathers last first, until `numel` more
  // elements fit within stage3.max_live_elems (or none is left).
  void DropKept(int64_t numel);
  // The trace position of `bucket`'s next gather (the trace's size when there is none).
  int64_t NextGather(int bucket) const;
  // Whether the recorded order gathers a unit released now again before stage3.max_reuse_elems
  // elements of other units (DeepSpeed's stage3_max_reuse_distance): Release with may_keep
  // then keeps it gathered (live, outside the prefetch window, while a whole window still fits
  // within stage3.max_live_elems, see RoomToKeep) instead of freeing it and gathering it again.
  bool GatheredAgainSoon(int bucket) const;
  // Whether `bucket`, released and gathered again soon, may stay gathered: it is the next
  // gather, or a whole prefetch window still fits within stage3.max_live_elems beside the
  // units gathered now.
  bool RoomToKeep(int bucket) const;
  // Whether `more_prefetched` more prefetched elements, `more_live` of them not live yet, stay
  // within stage3.prefetch_elems and stage3.max_live_elems.
  bool FitsPrefetchWindow(int64_t more_prefetched, int64_t more_live) const {
    return prefetched_elems_ + more_prefetched <= config_.prefetch_elems &&
           live_elems_ + more_live <= config_.max_live_elems;
  }
  void Prefetch();
  // The trace position where the micro-batch of the gather at trace_position_ ends.
  size_t MicroBatchEnd() const {
    for (size_t end : micro_batch_ends_) {
      if (end >= trace_position_) return end;
    }
    return trace_.size();
  }

  const Stage3Config config_;
  const partition::PartitionPlan& plan_;
  CollectivePath& path_;
  base::Allocator allocator_;
  DeviceOps& ops_;
  base::Logger logger_;
  bool warned_over_live_ = false;  // a gather went beyond max_live_elems (said once)
  EngineCounters& counters_;
  base::Buffer shards_;                // this rank's shard of every bucket, back to back
  std::vector<int64_t> shard_offset_;  // byte offset of each bucket's shard in shards_
  std::vector<Unit> units_;            // per bucket
  int64_t live_elems_ = 0, prefetched_elems_ = 0;
  // Released units' buffers kept for later gathers of the same size, so that a steady step
  // allocates none (no page faults, no cudaMalloc/cudaFree, which waits for the device): at
  // most stage3.prefetch_elems elements, within stage3.max_live_elems with the units gathered
  // (a gather that needs the room frees them first), and only buffers no collective the host
  // knows of can still write into (see FreeUnit). (buffer, elements)
  std::vector<std::pair<base::Buffer, int64_t>> spares_;
  int64_t SpareElems() const {
    int64_t elems = 0;
    for (const auto& spare : spares_) elems += spare.second;
    return elems;
  }
  Trace trace_state_ = Trace::kRecording;
  std::vector<int> trace_;  // buckets in the order a recorded step gathered them
  size_t trace_position_ = 0;
  std::vector<size_t> restarts_;  // trace positions of passes that may have restarted (Gather)
  std::vector<size_t> micro_batch_ends_;  // trace positions where a recorded micro-batch ended
  std::vector<uint64_t> set_hash_;  // per param, a hash of the values last given to Set
  ReplicaHasher hasher_;
  std::shared_ptr<LenderSlot> lender_;  // null: the engine allocates gathered units itself
};

StatusOr<int> ShardedParams::BucketOfUnit(int unit, const char* call) const {
  for (const Bucket& b : plan_.buckets()) {
    if (b.unit == unit && unit >= 0) return b.index;
  }
  return absl::NotFoundError(absl::StrCat(call, "(", unit, "): no param was registered with unit ", unit));
}

Status ShardedParams::StartGather(int bucket) {
  const Bucket& b = plan_.buckets()[bucket];
  if (live_elems_ + b.numel > config_.max_live_elems) DropKept(b.numel);
  if (live_elems_ + b.numel > config_.max_live_elems) ZERO_RETURN_IF_ERROR(DropPrefetched());
  // A unit the trainer needs is gathered even beyond the limit, as DeepSpeed's
  // stage3_max_live_parameters (a unit larger than the limit, a model called twice before
  // its backward); the limit bounds what is kept and prefetched.
  if (live_elems_ + b.numel > config_.max_live_elems && !units_[bucket].persistent && !warned_over_live_) {
    warned_over_live_ = true;
    ZERO_LOG(logger_, kWarn) << "stage 3: gathering unit " << b.unit << " (" << b.numel << " elements) holds "
                             << live_elems_ + b.numel << " gathered elements, above stage3.max_live_elems = "
                             << config_.max_live_elems << " with nothing kept or prefetched left to free; it is "
                             << "gathered anyway (said once): release units sooner, or raise the limit";
  }
  Unit& unit = units_[bucket];
  ZERO_ASSIGN_OR_RETURN(unit.buffer, TakeBuffer(b));
  unit.pending = StartUnitGather(b);
  live_elems_ += b.numel;
  return absl::OkStatus();
}

comm::WorkPtr ShardedParams::StartUnitGather(const Bucket& b) {
  Unit& unit = units_[b.index];
  if (path_.comm().size() == 1) {  // the shard is the whole unit: a copy, no collective
    return comm::CompletedWork(ops_.CopyOnDevice(unit.buffer.data(), Owned(b.index), b.bytes()));
  }
  return path_.Start([&](comm::Communicator& comm) {
    return comm.AllGather(Owned(b.index), unit.buffer.data(), b.shard_numel, b.dtype, b.unit);
  });
}

Status ShardedParams::FinishGather(int bucket) {
  if (units_[bucket].pending == nullptr) return absl::OkStatus();  // no message built for nothing
  const int unit = plan_.buckets()[bucket].unit;
  return path_.WaitOnStream(units_[bucket].pending, [unit] { return absl::StrCat("gathering unit ", unit); });
}

StatusOr<base::Buffer> ShardedParams::BorrowBuffer(const Bucket& b) {
  StatusOr<void*> lent = lender_->lender.lend(b.unit, b.bytes());
  if (!lent.ok()) {
    return absl::Status(lent.status().code(), absl::StrCat("the trainer's lender gave no memory for unit ", b.unit,
                                                           " (", b.bytes(), " bytes): ", lent.status().message()));
  }
  if (*lent == nullptr && b.bytes() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the trainer's lender gave a null address for unit ", b.unit, " (", b.bytes(), " bytes)"));
  }
  std::shared_ptr<LenderSlot> slot = lender_;
  const int unit = b.unit;
  comm::Communicator& comm = path_.comm();  // outlives the engine; not read once the slot is empty
  return allocator_.Borrow(*lent, b.bytes(), MemoryCategory::kGathered, ops_.placement(), [slot, unit, &comm] {
    // Not after a failure: a collective into the memory may still run (see GatheredMemoryLender).
    if (slot->lender.give_back != nullptr && comm.Health().ok()) slot->lender.give_back(unit);
  });
}

StatusOr<base::Buffer> ShardedParams::TakeBuffer(const Bucket& b) {
  if (lender_ != nullptr && !units_[b.index].persistent) return BorrowBuffer(b);
  for (size_t i = 0; i < spares_.size(); ++i) {
    if (spares_[i].first.bytes() != b.bytes() || spares_[i].second != b.numel) continue;
    base::Buffer buffer = std::move(spares_[i].first);
    spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(i));
    return buffer;
  }
  // A new buffer: first the spares that would take the gathered elements past max_live_elems.
  while (!spares_.empty() && live_elems_ + SpareElems() + b.numel > config_.max_live_elems) spares_.pop_back();
  StatusOr<base::Buffer> fresh = allocator_.Allocate(b.bytes(), MemoryCategory::kGathered, ops_.placement());
  if (!fresh.ok() && !spares_.empty()) {  // out of memory: the spares go first
    spares_.clear();
    fresh = allocator_.Allocate(b.bytes(), MemoryCategory::kGathered, ops_.placement());
  }
  if (fresh.ok()) ++counters_.gather_allocations;
  return fresh;
}

void ShardedParams::FreeUnit(int bucket, bool failed) {
  Unit& unit = units_[bucket];
  unit.kept = false;
  const int64_t numel = plan_.buckets()[bucket].numel;
  // Whether no all-gather the host knows of can still write into the buffer (after any failure
  // the group is broken, and a buffer of it is never reused). One the stream waits for may
  // still run on the communicator's stream: the next all-gather into the buffer is queued
  // behind it there, and a freed buffer's cudaFree waits for the device.
  const bool settled = unit.pending == nullptr && !failed && path_.comm().Health().ok();
  unit.pending.reset();  // abandons an all-gather still in flight before its buffer goes
  live_elems_ -= numel;
  const int64_t spare = SpareElems();
  if (settled && !unit.buffer.borrowed() && spare + numel <= config_.prefetch_elems && live_elems_ + spare + numel <= config_.max_live_elems) {
    spares_.emplace_back(std::move(unit.buffer), numel);
  } else {
    unit.buffer.Reset();
  }
}

Status ShardedParams::DropPrefetched() {
  for (const Bucket& b : plan_.buckets()) {
    Unit& unit = units_[b.index];
    if (unit.persistent || unit.holders > 0 || unit.buffer.data() == nullptr) continue;
    const Status gathered = FinishGather(b.index);  // MPI may still be writing into it
    if (!unit.kept) prefetched_elems_ -= b.numel;   // a kept unit was never in the window
    FreeUnit(b.index, /*failed=*/!gathered.ok());
    ZERO_RETURN_IF_ERROR(gathered);
  }
  return absl::OkStatus();
}

int64_t ShardedParams::NextGather(int bucket) const {
  size_t next = trace_position_;
  while (next < trace_.size() && trace_[next] != bucket) ++next;
  return static_cast<int64_t>(next);
}

void ShardedParams::DropKept(int64_t numel) {
  std::vector<std::pair<int64_t, int>> kept;  // (the next gather's place in the order, bucket)
  for (const Bucket& b : plan_.buckets()) {
    if (units_[b.index].kept) kept.emplace_back(NextGather(b.index), b.index);
  }
  std::sort(kept.rbegin(), kept.rend());
  for (const auto& [next, bucket] : kept) {
    if (live_elems_ + numel <= config_.max_live_elems) return;
    FreeUnit(bucket);
  }
}

void ShardedParams::Prefetch() {
  const size_t end = MicroBatchEnd();
  for (size_t k = trace_position_; k < end; ++k) {
    const int bucket = trace_[k];
    const Bucket& b = plan_.buckets()[bucket];
    if (units_[bucket].buffer.data() != nullptr) continue;  // held, kept or already on its way
    if (!FitsPrefetchWindow(b.numel, b.numel)) return;
    if (!StartGather(bucket).ok()) return;  // on demand later reports the problem
    prefetched_elems_ += b.numel;
  }
}

void ShardedParams::NoteRestarts(int bucket) {
  size_t kept = 0;
  for (size_t position : restarts_) {
    if (position < trace_.size() && trace_[position] == bucket) restarts_[kept++] = position + 1;
  }
  restarts_.resize(kept);
  if (trace_[0] == bucket) restarts_.push_back(1);
}

Status ShardedParams::Gather(int unit) {
  ZERO_ASSIGN_OR_RETURN(int bucket, BucketOfUnit(unit, "Gather"));
  Unit& u = units_[bucket];
  if (u.persistent) return absl::OkStatus();
  // Follow, record or drop the trace of gather order (one optimizer step's gathers).
  if (trace_state_ != Trace::kRecording) NoteRestarts(bucket);
  if (trace_state_ == Trace::kRecording) {
    trace_.push_back(bucket);
  } else if (trace_state_ == Trace::kValid && trace_position_ < trace_.size() && trace_[trace_position_] == bucket) {
    ++trace_position_;
  } else if (!restarts_.empty()) {
    // A pass from the top: the training step after an eval pass, whose forward followed the
    // trace's first gathers, or a pass that had left the trace.
    trace_position_ = *std::max_element(restarts_.begin(), restarts_.end());
    trace_state_ = Trace::kValid;
  } else if (trace_state_ == Trace::kValid) {
    // Control flow that changed, or an eval pass of other modules: on demand until a pass
    // starts from the top again (or the next step, which records the order again).
    ZERO_LOG(logger_, kInfo) << "stage 3: gather #" << trace_position_ << " of the step is unit " << unit
                             << ", not the recorded unit "
                             << (trace_position_ < trace_.size() ? plan_.buckets()[trace_[trace_position_]].unit : -1)
                             << ": the gather order changed; gathering on demand until a pass starts again "
                                "from the recorded first unit (else the next step records the order again)";
    ++counters_.trace_invalidations;
    ZERO_RETURN_IF_ERROR(DropPrefetched());
    trace_state_ = Trace::kOffTrace;
  }
  if (u.buffer.data() != nullptr && u.holders == 0) {  // prefetched (or kept) before the trainer asked
    ++counters_.gathers_prefetched;
    if (!u.kept) prefetched_elems_ -= plan_.buckets()[bucket].numel;
    u.kept = false;
  } else if (u.buffer.data() == nullptr) {
    ZERO_RETURN_IF_ERROR(StartGather(bucket));
    ++counters_.gathers_on_demand;
  }
  Status gathered = FinishGather(bucket);
  if (!gathered.ok()) {
    if (u.holders == 0) FreeUnit(bucket, /*failed=*/true);  // never handed out as if it held the values
    return gathered;
  }
  ++u.holders;
  if (trace_state_ == Trace::kValid) Prefetch();
  return absl::OkStatus();
}

Status ShardedParams::Lend(GatheredMemoryLender lender) {
  const bool stop = lender.lend == nullptr && lender.give_back == nullptr;
  if (stop) {
    // Prefetched units would be handed out from lent memory later: given back now.
    const Status dropped = lender_ != nullptr ? DropPrefetched() : absl::OkStatus();
    ForgetLender();
    return dropped;
  }
  if (lender.lend == nullptr || lender.give_back == nullptr) {
    return absl::InvalidArgumentError(
        "LendGatheredMemory: a lender needs both lend and give_back (neither, to stop lending)");
  }
  for (const Bucket& b : plan_.buckets()) {
    if (!units_[b.index].persistent && units_[b.index].holders > 0) {
      return absl::FailedPreconditionError(absl::StrCat("LendGatheredMemory: unit ", b.unit,
                                                        " is gathered; release every unit before lending memory"));
    }
  }
  ZERO_RETURN_IF_ERROR(DropPrefetched());
  spares_.clear();  // lent memory replaces the engine's own from now on
  lender_ = std::make_shared<LenderSlot>(LenderSlot{std::move(lender)});
  return absl::OkStatus();
}

Status ShardedParams::Release(int unit, bool may_keep) {
  const char* call = may_keep ? "ReleaseUntilBackward" : "Release";  // as the trainer called it
  ZERO_ASSIGN_OR_RETURN(int bucket, BucketOfUnit(unit, call));
  Unit& u = units_[bucket];
  if (u.persistent) return absl::OkStatus();
  if (u.holders == 0) {
    return absl::FailedPreconditionError(absl::StrCat(call, "(", unit, "): unit ", unit, " is not gathered"));
  }
  if (--u.holders > 0) return absl::OkStatus();
  if (may_keep && GatheredAgainSoon(bucket) && RoomToKeep(bucket)) {
    // kept: its next Gather is a hit
    u.kept = true;
    ++counters_.releases_kept;
  } else {
    FreeUnit(bucket);
  }
  return absl::OkStatus();
}

bool ShardedParams::RoomToKeep(int bucket) const {
  // The very next gather (the forward's last unit, which its backward gathers first): freeing it
  // would only gather it straight back into as much memory.
  if (NextGather(bucket) == static_cast<int64_t>(trace_position_)) return true;
  return live_elems_ + config_.prefetch_elems <= config_.max_live_elems;
}

bool ShardedParams::GatheredAgainSoon(int bucket) const {
  if (trace_state_ != Trace::kValid) return false;
  int64_t traversed = 0;  // elements the trainer gathers before `bucket` (the reuse distance)
  for (size_t k = trace_position_; k < trace_.size(); ++k) {
    if (traversed >= config_.max_reuse_elems) return false;
    if (trace_[k] == bucket) return true;
    traversed += plan_.buckets()[trace_[k]].numel;
  }
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<ParamStore>> CreateShardedParams(const ParamStore::Context& context) {
  int64_t bytes = 0;
  std::vector<int64_t> offsets = context.plan.CompactShardOffsets(/*trainable_only=*/false, &bytes);
  base::Allocator allocator = context.allocator;
  // Zero pages on the host: a model handed over param by param (init_context's slices freed as
  // their shards fill) never holds both whole.
  ZERO_ASSIGN_OR_RETURN(base::Buffer shards,
                        allocator.AllocateZeroed(bytes, MemoryCategory::kParams, context.ops.placement()));
  if (!shards.reads_as_zero()) ZERO_RETURN_IF_ERROR(context.ops.Zero(shards.data(), shards.bytes()));
  auto store = std::make_unique<ShardedParams>(context, std::move(shards), std::move(offsets));
  ZERO_RETURN_IF_ERROR(store->GatherPersistentUnits());
  return std::unique_ptr<ParamStore>(std::move(store));
}

}  // namespace zero::runtime
