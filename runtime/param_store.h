// (Internal to runtime.) Where params live and the collectives that keep every rank's view of
// them current: the params side of the stage policy, beside GradStore.
//
//   stages 0-2  every rank holds every param in one flat buffer laid out as the plan says;
//               after a step, stages 1-2 all-gather the shards each rank updated
//   stage 3     each rank holds only its shard of every bucket; a bucket is a unit the trainer
//               gathers for compute and releases, prefetched along the gather order recorded
//               over the first optimizer step (every Gather from Finalize to the first Step),
//               within stage3.max_live_elems; released units' buffers are kept for the next
//               gathers of their size (up to stage3.prefetch_elems elements), so a steady
//               step allocates none
//
// Every collective goes through the engine's CollectivePath.
#ifndef ZERO_RUNTIME_PARAM_STORE_H_
#define ZERO_RUNTIME_PARAM_STORE_H_

#include <cstdint>
#include <memory>

#include "base/allocator.h"
#include "base/logging.h"
#include "partition/partition_plan.h"
#include "runtime/collective_path.h"
#include "runtime/device_ops.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero::runtime {

class ParamStore {
 public:
  /// What a store works with; every reference outlives the store.
  struct Context {
    const Config& config;
    const partition::PartitionPlan& plan;
    CollectivePath& path;
    base::Allocator allocator;
    DeviceOps& ops;
    base::Logger logger;
    EngineCounters& counters;  ///< stage 3 counts its gathers here
  };

  /// The store of `config.stage`, its memory allocated on the ops' device and zeroed. At
  /// stage 3 the persistent units (see Gather) are gathered here: a collective.
  static StatusOr<std::unique_ptr<ParamStore>> Create(const Context& context);
  virtual ~ParamStore() = default;

  /// Whether every rank holds a full replica of every param (stages 0-2), so replicas can be
  /// compared and repaired at any time. At stage 3 only the values given to Set are compared.
  virtual bool holds_replicas() const = 0;

  /// Where this rank's owned part of `bucket` (PartitionPlan::Owned) lives, for the optimizer
  /// to step in place.
  virtual char* Owned(int bucket) = 0;
  /// Writes `param`'s values (host or device memory). At stage 3 a gathered copy is updated too.
  virtual Status Set(int param, const void* values) = 0;
  /// Copies `param`'s values out. At stage 3 a unit not gathered is gathered for the call and
  /// released after it: a collective, so every rank calls Get for the same params.
  virtual Status Get(int param, void* out) = 0;
  /// A view of `param`'s values, or null at stage 3 while its unit is not gathered.
  virtual void* View(int param) = 0;
  /// Stage 3: gathers `unit` (kNotFound if no param has it) and holds it until Release. A
  /// no-op at stages 0-2 and for persistent units.
  virtual Status Gather(int unit) = 0;
  /// Stage 3: drops one hold on `unit`, freeing it with the last (kFailedPrecondition if not
  /// gathered), or, `may_keep` (the end of a forward whose backward follows, where the
  /// trainer wrote no param), keeping it gathered when the recorded order gathers it again
  /// soon. A no-op at stages 0-2 and for persistent units.
  virtual Status Release(int unit, bool may_keep) = 0;
  /// Engine::ReleaseCachedUnits: frees the gathered units nobody holds and the spare buffers.
  virtual Status ReleaseUnheld() { return absl::OkStatus(); }
  /// Stage 3: where `param`'s values sit in its unit's gathered memory.
  virtual StatusOr<GatheredPlace> Place(int param) const = 0;
  /// Stage 3: gathered units in memory `lender` lends from now on (Engine::LendGatheredMemory).
  virtual Status Lend(GatheredMemoryLender lender) = 0;
  /// Stage 3: memory lent so far is never given back (the engine is being destroyed: its
  /// lender owns it again). A no-op at stages 0-2.
  virtual void ForgetLender() {}
  /// After an optimizer step that updated the owned parts (`updated`) or was skipped: every
  /// rank's view current again (stages 1-2 all-gather; stage 3 refreshes gathered units and
  /// follows its recorded gather order from the start).
  virtual Status AfterStep(bool updated) = 0;
  /// After a checkpoint's values were written into the owned parts: as AfterStep(true), and
  /// the values given to Set are forgotten.
  virtual Status AfterLoad() = 0;
  /// A hash of `param` to compare across ranks: of its values (stages 0-2) or of the values
  /// last given to Set (stage 3; 0 if none since the last AfterLoad).
  virtual StatusOr<uint64_t> ReplicaHash(int param) = 0;
  /// Rank 0's values of `param` on every rank (a collective). kFailedPrecondition at stage 3.
  virtual Status BroadcastFromRank0(int param) = 0;
  /// Waits for collectives still writing into the store (stage 3's gathers in flight).
  virtual Status WaitForCollectives() = 0;
  /// A micro-batch's backward ended (EndBackward: every rank at the same point of its
  /// collectives). Stage 3 prefetches no further than the end of the micro-batch it is in.
  virtual void EndOfMicroBatch() {}
};

/// The two families: stages 0-2 (param_store_replicated.cc) and stage 3 (param_store_sharded.cc).
StatusOr<std::unique_ptr<ParamStore>> CreateReplicatedParams(const ParamStore::Context& context);
StatusOr<std::unique_ptr<ParamStore>> CreateShardedParams(const ParamStore::Context& context);

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_PARAM_STORE_H_
