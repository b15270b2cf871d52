// The Engine's implementation (internal to runtime): the call protocol's state machine, and the
// pieces it orchestrates — the partition plan, the params and gradient stores of the stage,
// the collective path and bucket scheduler, the gradient guard, the optimizer state and the
// loss scaler.
#ifndef ZERO_RUNTIME_ENGINE_IMPL_H_
#define ZERO_RUNTIME_ENGINE_IMPL_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "runtime/bucket_scheduler.h"
#include "zero/communicator.h"
#include "partition/partition_plan.h"
#include "base/allocator.h"
#include "base/logging.h"
#include "runtime/checkpoint_files.h"
#include "runtime/checkpoint_format.h"
#include "runtime/collective_path.h"
#include "runtime/device_ops.h"
#include "runtime/grad_guard.h"
#include "runtime/grad_store.h"
#include "runtime/host_collectives.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/optimizer_state.h"
#include "runtime/param_store.h"
#include "zero/engine.h"

namespace zero::runtime {

/// `value` in the fewest significant digits (6 to 9) that read back as the same float, so two
/// values a message tells apart never print alike.
std::string Shortest(float value);

/// Makes the engine's DeviceOps for its config's device (DeviceOps::Create).
using OpsFactory = std::function<StatusOr<std::unique_ptr<DeviceOps>>(Device, const kernels::CpuExec&, base::Allocator)>;

/// Engine::Create with the DeviceOps `make_ops` gives: tests run the engine on a device model.
StatusOr<std::unique_ptr<Engine>> CreateEngine(const Config& config, comm::Communicator& communicator,
                                               const OpsFactory& make_ops);

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
  Status AddParamAlias(ParamId id, const std::string& alias) override;
  Status Finalize() override;
  Status SetStream(void* cuda_stream) override;
  Status SetParam(ParamId id, const void* values) override;
  Status GetParam(ParamId id, void* out) const override;
  StatusOr<void*> ParamData(ParamId id) override;
  Status Gather(int unit) override;
  Status Release(int unit) override;
  Status ReleaseUntilBackward(int unit) override;
  Status ReleaseCachedUnits() override;
  StatusOr<GatheredPlace> GatheredPlaceOf(ParamId id) const override;
  Status LendGatheredMemory(GatheredMemoryLender lender) override;
  Status SyncReplicas() override;
  Status BeginIteration() override;
  StatusOr<void*> GradBuffer(ParamId id) override;
  Status GradReady(ParamId id) override;
  Status GradAbsent(ParamId id) override;
  Status AccumulateGrad(ParamId id, const void* grad) override;
  Status AccumulateGrad(ParamId id, const void* grad, Placement placement) override;
  StatusOr<bool> LendGrad(ParamId id, const void* grad, Placement placement) override;
  Status EndBackward() override;
  Status AbandonMicroBatch() override;
  StatusOr<StepInfo> Step() override;
  Status DropGradients() override;
  StatusOr<float> LastGradNorm() override;
  StatusOr<float> ClipGradNorm(float max_norm) override;
  Status GetFullState(ParamId id, ParamState state, float* out) override;
  Status SetFullState(ParamId id, ParamState state, const float* values) override;
  Status SaveCheckpoint(const std::string& dir) override;
  Status SaveCheckpoint(const std::string& root, const std::string& tag) override;
  Status LoadCheckpoint(const std::string& dir) override;
  void set_checkpoint_user_data(std::string data) override { user_data_ = std::move(data); }
  const std::string& checkpoint_user_data() const override { return user_data_; }
  StatusOr<bool> PreemptionRequested() override;
  MemoryStats GetMemoryStats() const override { return allocator_.Stats(); }
  EngineCounters counters() const override {
    EngineCounters counters = counters_;
    counters.host_waits = path_.host_waits();
    return counters;
  }
  int64_t steps_taken() const override { return step_; }
  int num_groups() const override { return static_cast<int>(groups_.size()); }
  StatusOr<OptimizerHyper> GroupHyper(int group) const override;
  Status SetGroupHyper(int group, const OptimizerHyper& hyper) override;
  int64_t lr_schedule_iteration() const override { return schedule_ ? step_ - 1 : -1; }
  float loss_scale() const override { return loss_scaler_.scale(); }
  int rank() const override { return comm_.rank(); }
  int world_size() const override { return comm_.size(); }
  int64_t num_params() const override { return static_cast<int64_t>(specs_.size()); }

 private:
  // ZERO_DEBUG=DETAIL logs arrivals and launches of this many first micro-batches.
  static constexpr int64_t kDetailedIterations = 3;

  // The floats of step_scalars_: the squared norm (this rank's, then summed over ranks), the
  // global gradient norm, and the scale the optimizer kernels multiply gradients by.
  enum StepScalar { kSqNorm, kGradNorm, kGradScale, kStepScalars };

  enum class Phase {
    kRegistering,  // before Finalize
    kIdle,         // between micro-batches / steps
    kBackward,     // between BeginIteration and EndBackward
  };

  // Step: the squared norm in step_scalars_[kSqNorm] (this rank's) summed over ranks, the
  // decision to clip to `clip` taken on the device, and, where the host reads them, the norm
  // into `info` and last_grad_norm_. Returns whether the sum is not finite (false when not read).
  StatusOr<bool> DecideGradNorm(double divisor, float clip, StepInfo* info);
  // step_scalars_[kSqNorm], this rank's, summed over the ranks in place (on the device).
  Status SumSquaresOverRanks(const char* what);
  // Whether Step reads the norm on the host (synchronous ops, sync_grad_norm, or a loss
  // scaler's overflow check): then it is decided before the step, which waits for nothing more.
  bool ReadsNormOnHost() const;
  // After the host read the norm's sum: OK when the sum completed. Where the host waited for
  // it, a group broken later by a peer that went on does not fail it (no rank may fail a step
  // that a peer completed).
  Status RequireCompletedSum(const char* call);
  Status RequirePhase(Phase wanted, const char* call) const;
  // OK while the communicator's group works; once it broke, `call` fails with its first error
  // (the engine's state may differ from its peers', so nothing may go on).
  Status RequireHealthyGroup(const char* call) const;
  // OK unless an iteration failed where it could no longer finish (lost_iteration_): then
  // `call`, which would start or continue one, fails naming why.
  Status RequireFinishableIteration(const char* call) const;
  // Records `cause` as the reason iterations cannot go on (the first one wins) and returns it.
  Status LoseIteration(Status cause);
  Status CheckParamId(ParamId id, const char* call) const;
  // What GetFullState and SetFullState (`call`) share: a healthy group, between micro-batches,
  // a non-null `buffer`, a trainable param and a moment the optimizer keeps; returns the
  // moment's index (0: the weights or the gradient, 1, 2).
  StatusOr<int> CheckFullStateCall(ParamId id, ParamState state, const void* buffer, const char* call) const;
  // Inside an iteration, a registered and trainable param.
  Status CheckGradientCall(ParamId id, const char* call) const;
  std::string ParamLabel(int param) const { return guard_->Label(param); }
  // A param became complete: its bucket may launch once all its params are.
  Status ParamComplete(int param);
  // EndBackward's work after its checks; with `abandon`, params without a gradient count as
  // zeros whatever guard.on_unused says (AbandonMicroBatch).
  Status FinishBackward(bool abandon);
  // Every rank registered the same params in the same way; else names the first difference.
  Status CheckRegistryAgrees();
  // Collective: kInvalidArgument on every rank, "`what`: the ranks pass different ...", when
  // the `bytes` bytes at `data` (host memory) differ between ranks (compared by hash).
  Status AgreeOnBytes(const void* data, int64_t bytes, const std::string& what);
  // The error when the ranks' config values that shape collectives differ (the first key).
  Status CollectiveSettingsError();
  // Before a bucket's collective (guard.consistency_check): all ranks are at the same
  // (iteration, bucket, numel); else names both sides.
  Status CheckRanksAgree(int bucket);
  // For error messages: a bucket and its params.
  std::string DescribeBucket(int bucket) const;
  // Marks a bucket whose params are all ready, handing its reduction to the scheduler.
  Status BucketReady(int bucket);
  // Stage 2-3: waits for reductions in flight until `bucket` can have a gradient buffer
  // (for the gradient of param `arriving`; -1: none, the bucket completes without it).
  Status WaitForGradBuffer(int bucket, int arriving = -1);
  // Every pool buffer is held and nothing is in flight to free one: adds a buffer to the pool
  // (buckets.grow_pool; logged the first time), or loses the iteration saying why.
  Status GrowGradBufferPool(int arriving);
  // Why the pool ran short, for GrowGradBufferPool's log line and error: names the bucket
  // that holds the launches back and its params that have had no gradient (but `arriving`,
  // whose gradient is being written); ends in a clause the caller completes with its advice.
  std::string PoolShortfall(int arriving) const;
  // Before a gradient is written for `id` (GradBuffer, AccumulateGrad, named by `call`): the
  // call is valid now, the guard allows the write, and its bucket has a buffer (unless `lend`:
  // a gradient to be lent that the store keeps without one, GradStore::LendsWithoutBuffer).
  Status PrepareGradWrite(ParamId id, const char* call, bool lend = false);
  // AccumulateGrad (lend false) and LendGrad (lend true, where the store can keep `grad`):
  // whether `grad` was kept.
  StatusOr<bool> HandOverGrad(ParamId id, const void* grad, Placement placement, bool lend, const char* call);
  bool LastMicroBatch() const { return micro_batch_ + 1 == config_.gradient_accumulation_steps; }

  // Optimizer groups (engine_groups.cc).
  // At Finalize: every group's hyperparameters from the config, and the schedule's first lrs.
  void InitGroups();
  // After an applied step (and a load): the schedule's lr for the next step in every group.
  void ApplySchedule();
  // Step, where the host reads the step's values anyway (ReadsNormOnHost: always on the CPU):
  // every rank holds the same settings in every group (SetGroupHyper is local, so a rank that
  // alone changed its lr would step its shard with it); else kFailedPrecondition naming the
  // first group and setting that differ, before anything changed. A collective.
  Status CheckGroupsAgree();

  // Checkpoints (checkpoint.cc).
  // After a step every rank took on its own (writing or reading its part): `local` on this
  // rank, kAborted naming a failing rank on the others, OK only if every rank succeeded.
  Status AgreeOnOutcome(const Status& local, const std::string& what);
  // Writes this rank's file of a checkpoint at `path`; its index checksum in `index_checksum`.
  Status WriteRankFile(const std::string& path, uint64_t* index_checksum);
  // SaveCheckpoint(dir), recording `series_seq` (its place in a series; 0 outside one). Rank 0
  // holds the lock of dir's parent while it saves, unless it holds it already (a series root
  // it saved into: series_locks_).
  Status SaveCheckpointAs(const std::string& dir, int64_t series_seq);
  // Collective, before a save checks or creates anything: kInvalidArgument on every rank when
  // the ranks name different directories (`dir` as this rank names it, compared as an
  // absolute path with links resolved: "ckpt" and "./ckpt" are one).
  Status AgreeOnCheckpointDir(const std::string& dir);
  // Rank 0: locks `dir` for a save into it (checkpoint_files.h), waiting for another job's save
  // up to half of guard.timeout_s (0: forever), so that the ranks waiting for rank 0 in the
  // next collective hear why instead of timing out; warns where the file system cannot lock.
  Status LockForSave(const std::string& dir, std::optional<DirectoryLock>* lock);
  // Rank 0: holds the lock of series root `root` from this engine's first save into it (which
  // waits as LockForSave) until the engine goes.
  Status HoldSeriesLock(const std::string& root);
  // The registered trainable params (in order) and the optimizer are the checkpoint's; else
  // names the difference. Frozen params are matched by name: a frozen param registered here
  // and not in the checkpoint (or the other way round: a stage-3 run shards a model's frozen
  // base, a stage-2 run leaves it out) is no difference; one the checkpoint saved
  // (checkpoint.save_frozen) must have the registered one's shape. Returns, for each
  // checkpoint param, the registered index (-1: a frozen one not registered here).
  StatusOr<std::vector<int>> MatchCheckpointParams(const CheckpointMeta& meta) const;
  // Part of a frozen param as a load writes it into the param store: elements [begin, begin +
  // numel) in the param's dtype.
  struct FrozenPart {
    int64_t begin = 0;
    int64_t numel = 0;
    std::vector<char> bytes;
  };
  // What this rank loads from a checkpoint, by registered param: its owned parts of trainable
  // params (weights and moments), and its parts of the frozen params the checkpoint saved.
  struct CheckpointShard {
    std::map<int, std::vector<OptimizerState::OwnedPart>> trainable;
    std::map<int, std::vector<FrozenPart>> frozen;
  };
  // Host copies of this rank's parts filled from the checkpoint's records; `registered` is
  // MatchCheckpointParams'.
  StatusOr<CheckpointShard> ReadCheckpointShard(const std::string& dir, const CheckpointMeta& meta,
                                                const std::vector<int>& registered);
  // Frozen params in checkpoints (checkpoint_frozen.cc, checkpoint.save_frozen).
  // The parts (begin, numel) of frozen `param` this rank writes when saving, or reads when
  // `loading`.
  std::vector<std::pair<int64_t, int64_t>> FrozenParts(int param, bool loading) const;
  // Where this rank keeps element `begin` of frozen `param` (one of its FrozenParts).
  char* FrozenAddress(int param, int64_t begin);
  // Elements [begin, begin + numel) of frozen `param` widened to fp32 into `out` (through the
  // host bytes `staging`).
  Status ReadFrozenValues(int param, int64_t begin, int64_t numel, std::vector<char>* staging,
                          std::vector<float>* out);
  // `part` into the param store.
  Status WriteFrozenValues(int param, const FrozenPart& part);
  // fp32 `values` of elements [begin, begin + numel) of `param`, narrowed to its dtype, into
  // `part` (which holds them).
  void NarrowIntoFrozenPart(int param, const float* values, int64_t begin, int64_t numel, FrozenPart* part) const;

  // Replicas (engine_replicas.cc).
  // Params whose hash (ParamStore::ReplicaHash) differs on some rank from rank 0's;
  // `*ranks_of_first` gets the ranks that differ on the first of them.
  StatusOr<std::vector<int>> ParamsDifferingFromRank0(std::vector<int>* ranks_of_first);
  // Once, before the first iteration: rank 0's params everywhere (guard.init_params).
  Status SyncReplicasOnce();
  // After Step, every guard.replica_check_every steps: kDataLoss if the replicas differ.
  Status CheckReplicasAgree();

  const Config config_;
  comm::Communicator& comm_;
  base::Logger logger_;
  base::Allocator allocator_;
  std::unique_ptr<DeviceOps> ops_;
  CollectivePath path_;
  HostCollectives host_;
  LossScaler loss_scaler_;

  EngineCounters counters_;  // before the stores, which count into it
  std::vector<ParamSpec> specs_;
  std::vector<std::vector<std::string>> aliases_;  // by param: its other names (AddParamAlias)
  std::unordered_set<std::string> registered_names_;  // specs_' names (RegisterParam's check)
  std::optional<partition::PartitionPlan> plan_;
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<GradStore> grads_;
  std::unique_ptr<BucketScheduler> scheduler_;
  std::unique_ptr<OptimizerState> optimizer_;

  Phase phase_ = Phase::kRegistering;
  // Why the iteration's last EndBackward was refused with the micro-batch left open (the guard's
  // unused params), for the next BeginIteration's message; empty otherwise.
  std::string refused_end_backward_;
  // Not OK once a micro-batch failed half done (its buckets partly launched, a bucket holding
  // the buffer the next one needs): neither it nor a later one can finish, so BeginIteration,
  // the gradient calls, EndBackward, Step, ClipGradNorm, DropGradients, AbandonMicroBatch and
  // LoadCheckpoint refuse with it.
  Status lost_iteration_ = absl::OkStatus();
  int micro_batch_ = 0;        // micro-batches completed since the last Step
  int64_t iteration_ = 0;      // micro-batches begun in total
  int64_t step_ = 0;           // optimizer steps taken
  std::vector<int64_t> param_steps_;  // per param: steps that updated it (bias correction)
  std::vector<OptimizerHyper> groups_;  // per optimizer group, for the next step
  std::optional<LrSchedule> schedule_;  // config "scheduler"
  std::unique_ptr<GradGuard> guard_;
  std::vector<int> pending_;   // per bucket: params not yet complete this micro-batch
  std::vector<char> handed_;   // per bucket: reduction handed to the scheduler this micro-batch
  base::Buffer grad_staging_;  // device "cuda": host gradients given to AccumulateGrad
  // The step's scalars on the engine's device (StepScalar): decided there, read by the kernels.
  base::Buffer step_scalars_;
  std::optional<float> last_grad_norm_;  // the last Step's norm, once on the host
  bool grad_norm_on_device_ = false;     // the last Step left its norm in step_scalars_ only
  // ClipGradNorm's decision for the next Step: the norm and overflow it found, with the
  // gradient scale it left in step_scalars_, which Step takes instead of summing the same
  // gradients again (nothing can change them between the two).
  struct DecidedClip {
    float grad_norm = 0.0f;
    bool overflow = false;
  };
  std::optional<DecidedClip> step_clip_;
  Status diverged_;  // set once guard.consistency_check found ranks apart; later checks fail fast
  bool replicas_synced_ = false;   // SyncReplicas ran
  std::string user_data_;  // trainer state saved in and loaded from checkpoints
  // Rank 0: the locks of the series roots this engine saved into, held until it is destroyed
  // (or the process ends), so that another job never saves into them meanwhile.
  std::map<std::string, DirectoryLock> series_locks_;
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_ENGINE_IMPL_H_
