// The Engine's implementation (internal to runtime): state machine, buffers, and the pieces it
// orchestrates — the partition plan, the gradient store of the stage, the bucket scheduler,
// the optimizer state and the loss scaler.
#ifndef ZERO_RUNTIME_ENGINE_IMPL_H_
#define ZERO_RUNTIME_ENGINE_IMPL_H_

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/bucket_scheduler.h"
#include "zero/communicator.h"
#include "partition/partition_plan.h"
#include "base/allocator.h"
#include "base/logging.h"
#include "runtime/checkpoint_format.h"
#include "runtime/device_ops.h"
#include "runtime/grad_guard.h"
#include "runtime/grad_store.h"
#include "runtime/host_collectives.h"
#include "runtime/loss_scaler.h"
#include "runtime/optimizer_state.h"
#include "zero/engine.h"

namespace zero::runtime {

class EngineImpl final : public Engine {
 public:
  EngineImpl(const Config& config, comm::Communicator& comm, base::Logger logger,
             base::Allocator allocator, std::unique_ptr<DeviceOps> ops);
  /// While the group works, waits (up to guard.timeout_s) for collectives still writing into
  /// the engine's buffers; once it broke, waits for nothing. Collectives still in flight are
  /// abandoned before any buffer is freed, and where they may still touch buffers (MPI) the
  /// engine's memory is kept allocated instead of freed.
  ~EngineImpl() override;

  StatusOr<ParamId> RegisterParam(const ParamSpec& spec) override;
  Status Finalize() override;
  Status SetStream(void* cuda_stream) override;
  Status SetParam(ParamId id, const void* values) override;
  Status GetParam(ParamId id, void* out) const override;
  StatusOr<void*> ParamData(ParamId id) override;
  Status Gather(int unit) override;
  Status Release(int unit) override;
  Status BeginIteration() override;
  StatusOr<void*> GradBuffer(ParamId id) override;
  Status GradReady(ParamId id) override;
  Status AccumulateGrad(ParamId id, const void* grad) override;
  Status EndBackward() override;
  StatusOr<StepInfo> Step() override;
  Status SaveCheckpoint(const std::string& dir) override;
  Status SaveCheckpoint(const std::string& root, const std::string& tag) override;
  Status LoadCheckpoint(const std::string& dir) override;
  void set_checkpoint_user_data(std::string data) override { user_data_ = std::move(data); }
  const std::string& checkpoint_user_data() const override { return user_data_; }
  StatusOr<bool> PreemptionRequested() override;
  MemoryStats GetMemoryStats() const override { return allocator_.Stats(); }
  EngineCounters counters() const override { return counters_; }
  int64_t steps_taken() const override { return step_; }
  float loss_scale() const override { return loss_scaler_.scale(); }
  int rank() const override { return comm_.rank(); }
  int world_size() const override { return comm_.size(); }
  int64_t num_params() const override { return static_cast<int64_t>(specs_.size()); }

 private:
  // ZERO_DEBUG=DETAIL logs arrivals and launches of this many first micro-batches.
  static constexpr int64_t kDetailedIterations = 3;

  enum class Phase {
    kRegistering,  // before Finalize
    kIdle,         // between micro-batches / steps
    kBackward,     // between BeginIteration and EndBackward
  };

  Status RequirePhase(Phase wanted, const char* call) const;
  // OK while the communicator's group works; once it broke, `call` fails with its first error
  // (the engine's state may differ from its peers', so nothing may go on).
  Status RequireHealthyGroup(const char* call) const;
  Status CheckParamId(ParamId id, const char* call) const;
  // Inside an iteration, a registered and trainable param.
  Status CheckGradientCall(ParamId id, const char* call) const;
  std::string ParamLabel(int param) const { return guard_->Label(param); }
  // A param became complete: its bucket may launch once all its params are.
  Status ParamComplete(int param);
  // Every rank registered the same params in the same way; else names the first difference.
  Status CheckRegistryAgrees();
  // Before a bucket's collective (guard.consistency_check): all ranks are at the same
  // (iteration, bucket, numel); else names both sides.
  Status CheckRanksAgree(int bucket);
  // For error messages: a bucket and its params.
  std::string DescribeBucket(int bucket) const;
  int64_t ParamBytes(int param) const;
  char* ParamAddress(int param) const;
  // Marks a bucket whose params are all ready, handing its reduction to the scheduler.
  Status BucketReady(int bucket);
  // On a GPU with a communicator that does not order itself after the stream (local, mpi),
  // the work queued on the engine's stream must finish before a collective reads its buffers.
  bool CollectivesWaitForStream() const;
  // That wait (on the engine's stream, not the device) where it is needed; else nothing.
  Status BeforeCollective();
  bool LastMicroBatch() const { return micro_batch_ + 1 == config_.gradient_accumulation_steps; }
  Status AllGatherParams();

  // Checkpoints (checkpoint.cc).
  // After a step every rank took on its own (writing or reading its part): `local` on this
  // rank, kAborted naming a failing rank on the others, OK only if every rank succeeded.
  Status AgreeOnOutcome(const Status& local, const std::string& what);
  Status WriteRankFile(const std::string& path);
  // The registered params and the optimizer are the checkpoint's; else names the difference.
  Status CheckCheckpointMatches(const CheckpointMeta& meta) const;
  // Host copies of this rank's owned parts filled from the checkpoint's records.
  StatusOr<std::map<int, std::vector<OptimizerState::OwnedPart>>> ReadCheckpointShard(
      const std::string& dir, const CheckpointMeta& meta);

  // Replicas (engine_replicas.cc).
  // A hash of host or device values.
  StatusOr<uint64_t> HashValues(const void* values, int64_t bytes);
  // Params whose hash differs on some rank from rank 0's (stage 3: the values given to
  // SetParam); `*ranks_of_first` gets the ranks that differ on the first of them.
  StatusOr<std::vector<int>> ParamsDifferingFromRank0(std::vector<int>* ranks_of_first);
  // Once, before the first iteration: rank 0's params everywhere (guard.init_params).
  Status SyncReplicas();
  // After Step, every guard.replica_check_every steps: kDataLoss if the replicas differ.
  Status CheckReplicasAgree();

  // Stage 3 (engine_units.cc).
  struct Unit {
    base::Buffer buffer;    // the gathered full bucket, or empty
    comm::WorkPtr pending;  // its all-gather, until waited for
    int holders = 0;        // Gathers not yet Released
    bool persistent = false;
  };
  enum class Trace { kRecording, kValid, kInvalid };
  Status SetupUnits();
  StatusOr<int> BucketOfUnit(int unit, const char* call) const;
  // Allocates the bucket's buffer within max_live_elems and starts its all-gather.
  Status StartGather(int bucket);
  Status FinishGather(int bucket);
  void FreeUnit(int bucket);
  // Drops prefetched units nobody asked for yet (after their all-gathers complete).
  Status DropPrefetched();
  void Prefetch();
  // After a step: every gathered unit's buffer gets the new values.
  Status RefreshGathered();
  char* ShardOf(int bucket) { return params_.as<char>() + shard_offset_[bucket]; }
  // The param's full value at stage 3 while its unit is gathered, else null.
  char* GatheredParam(int param);
  // GetParam at stage 3: from the gathered unit, gathering it for the call if needed.
  Status GetParamStage3(int param, void* out);

  const Config config_;
  comm::Communicator& comm_;
  base::Logger logger_;
  base::Allocator allocator_;
  std::unique_ptr<DeviceOps> ops_;
  HostCollectives host_;
  LossScaler loss_scaler_;

  std::vector<ParamSpec> specs_;
  std::optional<partition::PartitionPlan> plan_;
  base::Buffer params_;
  std::unique_ptr<GradStore> grads_;
  std::unique_ptr<BucketScheduler> scheduler_;
  std::unique_ptr<OptimizerState> optimizer_;

  Phase phase_ = Phase::kRegistering;
  int micro_batch_ = 0;        // micro-batches completed since the last Step
  int64_t iteration_ = 0;      // micro-batches begun in total
  int64_t step_ = 0;           // optimizer steps taken
  std::unique_ptr<GradGuard> guard_;
  std::vector<int> pending_;   // per bucket: params not yet complete this micro-batch
  std::vector<char> handed_;   // per bucket: reduction handed to the scheduler this micro-batch
  EngineCounters counters_;
  std::vector<Unit> units_;            // stage 3, per bucket
  std::vector<int64_t> shard_offset_;  // stage 3: byte offset of each bucket's shard in params_
  int64_t live_elems_ = 0, prefetched_elems_ = 0;
  Trace trace_state_ = Trace::kRecording;
  std::vector<int> trace_;  // buckets in the order the first iteration gathered them
  size_t trace_position_ = 0;
  base::Buffer grad_staging_;  // device "cuda": host gradients given to AccumulateGrad
  Status diverged_;  // set once guard.consistency_check found ranks apart; later checks fail fast
  bool replicas_synced_ = false;   // SyncReplicas ran
  std::vector<uint64_t> set_hash_;  // stage 3: per param, a hash of the values given to SetParam
  base::Buffer replica_staging_;    // device params hashed through host memory
  std::string user_data_;  // trainer state saved in and loaded from checkpoints
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_ENGINE_IMPL_H_
