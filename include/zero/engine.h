// The ZeroRT engine: owns a model's params, gradients and optimizer states as flat sharded
// buffers, reduces gradients across data-parallel ranks while backward runs, and steps fused
// optimizer kernels on each rank's shard.
//
// One Engine per rank. The iteration protocol:
//
//   auto engine = Engine::Create(config, communicator);      // one per rank
//   id = engine->RegisterParam({"layer0.weight", {out, in}, DType::kFP32});
//   engine->Finalize();                                        // plan + allocation
//   engine->SetParam(id, initial_values);
//   loop over steps:
//     repeat gradient_accumulation_steps times (micro-batches):
//       engine->BeginIteration();
//       ... forward using ParamData(id) ...
//       ... backward: for each param as its gradient is produced:
//             add it into GradBuffer(id), then GradReady(id)     (or AccumulateGrad(id, g))
//       engine->EndBackward();
//     info = engine->Step();
//
// Gradients are *added* into GradBuffer(id) (as PyTorch accumulates into .grad); the engine
// zeroes them at the start of each optimizer step's first micro-batch. Gradients are averaged
// over ranks (sum / world, as DDP); micro-batches are summed (divide the loss by the number of
// micro-batches, as in PyTorch). Calls out of order are kFailedPrecondition naming the call
// and the state; nothing is modified by a failed call, with two exceptions. A collective that
// fails (a peer's error, a timeout, a transport error) breaks the communicator's group, because
// the ranks may now hold different states. Every later call then returns that first error
// (EndBackward and Step may have begun their collectives before it came); the way on is to
// restart the ranks and load the last checkpoint. And Step counts as taken once its update began:
// a device error (CUDA) after that may leave the params partly updated, and Step is not
// accepted again for the same micro-batches; restart from the last checkpoint too.
//
// The gradient guard (config "guard", zero/config.h): a second gradient for a param is
// DuplicateGradient (IsDuplicateGradient) or, with on_duplicate = "count", summed; params with
// no gradient at EndBackward are UnusedParameters (IsUnusedParameters) or, with on_unused =
// "zero", zeros; Finalize compares the registries of all ranks; consistency_check makes ranks
// agree before each bucket's collective; timeout_s bounds every wait.
//
// Implemented: stages 0, 1, 2 and 3 on device "cpu" (any communicator with host buffers) and
// on device "cuda" (built with CUDA; NCCL on device buffers, the local and MPI communicators
// through host staging; the GPU figures and what has not run on a GPU yet are in
// bench/RESULTS.md).
#ifndef ZERO_ENGINE_H_
#define ZERO_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zero/config.h"
#include "zero/dtype.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero {

namespace comm {
class Communicator;
}

/// A registered parameter's handle: its registration index.
using ParamId = int64_t;

/// Optimizer groups are 0 to kMaxOptimizerGroups - 1 (as optimizer.param_groups' length).
inline constexpr int kMaxOptimizerGroups = 65536;

/// What the trainer declares about a parameter.
struct ParamSpec {
  std::string name;             ///< unique; used in every message about the param
  std::vector<int64_t> shape;   ///< all dimensions ≥ 1
  DType dtype = DType::kFP32;   ///< fp32, bf16 or fp16
  bool requires_grad = true;    ///< false: laid out, never reduced or stepped
  int group = 0;                ///< optimizer group, [0, kMaxOptimizerGroups); groups never share a bucket
  int unit = -1;                ///< stage 3: params with the same unit (≥ 0) are gathered together; -1: none
};

/// The outcome of one Step().
struct StepInfo {
  int64_t step = 0;         ///< optimizer steps taken so far (skipped ones not counted)
  /// an Inf/NaN gradient was found on some rank: nothing changed. Only with a loss scale
  /// (loss_scale.mode "static" or "dynamic"; DeepSpeed's fp16, and bf16's check_grad_overflow);
  /// with "none" the step applies what it is given, as PyTorch's optimizers do
  bool skipped = false;
  /// global L2 norm of the averaged, unscaled gradient (before clipping); NaN when Step left
  /// it on the device (Config::sync_grad_norm false): Engine::LastGradNorm() reads it
  float grad_norm = 0.0f;
  float loss_scale = 1.0f;  ///< the loss scale to multiply the next loss by
};

/// Counters that show what the engine did; for tests, logs and benchmarks.
struct EngineCounters {
  int64_t reductions_launched = 0;            ///< bucket collectives started
  int64_t reductions_before_end_backward = 0; ///< ... of which before EndBackward() was called
  int64_t pool_waits = 0;                     ///< stage 2: GradBuffer calls that waited for a buffer
  int64_t gathers_prefetched = 0;  ///< stage 3: Gathers whose all-gather prefetch had started
  int64_t gathers_on_demand = 0;   ///< stage 3: Gathers that had to start their all-gather
  int64_t trace_invalidations = 0; ///< stage 3: gathers off the recorded order (prefetch paused)
  /// stage 3: gathered-unit buffers allocated; a gather reuses a released unit's buffer of
  /// its size when one is kept (up to stage3.prefetch_elems elements), so a steady step
  /// allocates none.
  int64_t gather_allocations = 0;
  int64_t checkpoint_bytes_read = 0;  ///< bytes LoadCheckpoint read from rank files
  /// Bytes of the trainer's gradients AccumulateGrad copied or added into the engine's
  /// buffers (the param's dtype; a gradient written into GradBuffer directly counts none).
  int64_t grad_bytes_copied = 0;
  /// Times the engine made its caller's thread wait: for a collective not yet complete, or
  /// for the device (cuda: every stream synchronisation: before a collective that is not
  /// ordered on the stream, to hand values to the host, and in copies between the host and
  /// the device such as SetParam, GetParam and checkpoints). Each such wait drains the GPU's
  /// queue. 0 on the CPU for a rank alone, which runs no collective.
  int64_t host_waits = 0;
  /// stage 3: ReleaseUntilBackward calls that kept their unit gathered because the recorded
  /// gather order gathers it again within stage3.max_reuse_elems: its next Gather then runs no
  /// all-gather (a forward's units, which backward gathers again).
  int64_t releases_kept = 0;
  /// stages 2-3: gradient buffers added to the pool beyond buckets.pool_buffers because every
  /// buffer was held by a bucket still being filled and none was in flight (buckets.grow_pool)
  int64_t pool_buffers_added = 0;
};

/// One of a trainable param's full fp32 values that Engine::GetFullState copies out.
enum class ParamState {
  kWeights = 0,       ///< the fp32 master weights (the params themselves for fp32 params)
  kFirstMoment = 1,   ///< the optimizer's first buffer: AdamW/Adam/LAMB/Lion exp_avg, SGD momentum
  kSecondMoment = 2,  ///< AdamW/Adam/LAMB exp_avg_sq
  /// the gradient the next Step applies: summed over the micro-batches, averaged over the
  /// ranks, loss scale divided out, before clipping
  kGrad = 3,
};

/// Stage 3: where a param's values sit in its unit's gathered memory (Engine::GatheredPlaceOf).
struct GatheredPlace {
  int unit = -1;              ///< the param's unit (ParamSpec::unit)
  int64_t offset_bytes = 0;   ///< byte offset of the param's first element in that memory
  int64_t unit_bytes = 0;     ///< the unit's gathered bytes (padded: may exceed its params')
  bool persistent = false;    ///< the unit stays gathered in the engine's memory, never lent
};

/// Memory a trainer lends the engine for stage 3's gathered units
/// (Engine::LendGatheredMemory). Both functions run on the thread calling into the engine.
struct GatheredMemoryLender {
  /// `bytes` bytes for `unit`'s gathered values (device memory of the engine's GPU on
  /// device "cuda", host memory on "cpu"), aligned for the unit's dtype, left untouched by
  /// the trainer until give_back(unit). Called as a gather or a prefetch of the unit starts;
  /// an error fails that gather (a prefetch is left to be gathered on demand).
  std::function<StatusOr<void*>(int unit, int64_t bytes)> lend;
  /// The engine is done with the memory lent for `unit`: the unit was released, or its
  /// prefetch dropped. On device "cuda" the engine's last use of it is queued on the engine's
  /// stream (SetStream): reuse it in that stream's order. Not called once the communicator's
  /// group broke (a collective may still write into the memory: the trainer keeps it for
  /// good then), nor after the lending stopped, nor while the engine is destroyed: memory
  /// still lent then stays the trainer's to free once the engine is gone (its destructor
  /// waits for the collectives into it, unless the group broke).
  std::function<void(int unit)> give_back;
};

class Engine {
 public:
  /// Creates an engine for this rank. `communicator` must outlive the engine. Config errors
  /// name the key; unsupported combinations are kUnimplemented.
  static StatusOr<std::unique_ptr<Engine>> Create(const Config& config,
                                                  comm::Communicator& communicator);
  virtual ~Engine() = default;

  /// Declares a parameter (before Finalize). Returns its id (0, 1, 2, … in order).
  virtual StatusOr<ParamId> RegisterParam(const ParamSpec& spec) = 0;
  /// Records `alias` as another name of registered param `id` (a tied weight: a language
  /// model's output layer that is its embedding), before Finalize. Checkpoints record it, so
  /// a consolidated file (zero-ckpt consolidate) holds the values under every name, as the
  /// model's state dict does. kInvalidArgument when the name is empty, not UTF-8, or taken.
  virtual Status AddParamAlias(ParamId id, const std::string& alias) = 0;
  /// Builds the partition plan and allocates every buffer. All ranks must register the same
  /// params in the same order.
  virtual Status Finalize() = 0;

  /// Device "cuda": the cudaStream_t (as void*) the trainer computes on; null is the legacy
  /// default stream (the initial setting). The engine queues its kernels there, so gradients
  /// written on it before GradReady are complete when their bucket is reduced, and params the
  /// step writes are ready for kernels queued after Step() returns. Pass the same stream to
  /// the nccl communicator (NcclOptions::stream). Outside an iteration; kInvalidArgument for
  /// a non-null stream on device "cpu".
  virtual Status SetStream(void* cuda_stream) = 0;

  /// Copies a full initial value (the param's dtype; host or device memory) into the param; resets
  /// the fp32 master copy of the rank's part. After Finalize, before or between steps.
  virtual Status SetParam(ParamId id, const void* values) = 0;
  /// Copies the param's full current value into `out` (host or device memory, the param's
  /// dtype). At stage 3 a
  /// param whose unit is not gathered is gathered for the call: every rank must call it.
  virtual Status GetParam(ParamId id, void* out) const = 0;
  /// A view of the param's full value (device memory on device "cuda"), valid until the
  /// engine is destroyed (stages 0-2) or until its unit is released (stage 3:
  /// kFailedPrecondition when the unit is not gathered).
  virtual StatusOr<void*> ParamData(ParamId id) = 0;

  /// Stage 3: gathers `unit`'s params (every rank's shard) so that ParamData views of them are
  /// valid until Release(unit). Collective: all ranks gather the same units in the same order.
  /// The first optimizer step's gathers (Finalize to the first Step, forward and backward) are
  /// recorded; from then on each Gather prefetches the units the recorded order says come next
  /// (up to stage3.prefetch_elems), so the all-gathers overlap compute. An eval pass between
  /// steps follows the record's first gathers, and the step after it starts from the top of the
  /// record again: prefetching goes on. A gather off the record (changed control flow; an INFO
  /// log line) gathers on demand until a pass starts from the record's first unit again; a
  /// step that never does has the next step record the order again. Each gather's all-gather
  /// carries its unit as the collective's tag, so ranks gathering different units fail
  /// (kInvalidArgument naming both). Never holds more than stage3.max_live_elems
  /// gathered elements: kept units (ReleaseUntilBackward) and then prefetched ones are dropped
  /// first, then kResourceExhausted.
  /// Gathered and prefetched units count against the limit; buffers Release kept are freed to
  /// make room.
  /// A no-op at stages 0-2 and for persistent units (smaller than persistence_threshold, or
  /// params registered without a unit), which stay gathered.
  virtual Status Gather(int unit) = 0;
  /// Stage 3: the trainer is done with `unit` for now; its buffer is freed, or kept for a
  /// later gather of its size (up to stage3.prefetch_elems elements of such buffers, within
  /// stage3.max_live_elems), so a steady step allocates none. A write into its ParamData
  /// views lasts until then: the next Gather reads the shards. The trainer's reads of its
  /// ParamData views must be done by then (cuda: queued on the engine's stream, SetStream).
  virtual Status Release(int unit) = 0;
  /// Stage 3: Release at the end of `unit`'s forward when its backward follows (the forward's
  /// outputs need gradients), in any phase: a unit the recorded gather order gathers again
  /// after fewer than stage3.max_reuse_elems elements of other units (DeepSpeed's
  /// stage3_max_reuse_distance) stays gathered for that backward instead of being freed and
  /// gathered straight back (counters().releases_kept), while a whole prefetch window still
  /// fits within stage3.max_live_elems beside the live units (always when it is the very next
  /// gather: the forward's last unit, which its backward gathers first). Kept units count towards
  /// max_live_elems, not stage3.prefetch_elems; a gather that needs their room frees them
  /// first, the one gathered again last first. The trainer must not write into the unit's ParamData views until it
  /// gathers it again (SetParam and Step keep a kept unit right).
  virtual Status ReleaseUntilBackward(int unit) = 0;
  /// Stage 3: frees every gathered unit the trainer does not hold: units prefetched for
  /// gathers still to come (after their all-gathers end), units ReleaseUntilBackward kept, and
  /// the buffers Release kept for reuse, as DeepSpeed's empty_partition_cache (before an eval
  /// or a generation pass that needs the memory, or at the end of training). Units gathered and
  /// not released stay. Later gathers of the freed units gather on demand, so every rank calls
  /// it at the same point of its calls (ranks whose gathers then differ fail naming both
  /// units). A no-op at stages 0-2.
  virtual Status ReleaseCachedUnits() = 0;

  /// Stage 3: where `id`'s values sit in its unit's gathered memory (GatheredPlace). After
  /// Finalize; kFailedPrecondition below stage 3.
  virtual StatusOr<GatheredPlace> GatheredPlaceOf(ParamId id) const = 0;
  /// Stage 3: from now on the units Gather (and prefetching) brings in live in memory
  /// `lender` lends (GatheredMemoryLender), so that a trainer's own tensors can be the
  /// gathered values: the all-gather writes straight into them (PyTorch: one flat storage per
  /// unit whose params are views of it, resized to nothing between uses, as FSDP does).
  /// Persistent units stay in the engine's memory; released units' buffers are no longer kept
  /// (the lender's allocator caches instead). A lender with both functions null stops the
  /// lending, at any time: prefetched units are given back first; units still gathered keep
  /// using their lent memory until released, and nothing more is given back. Stopping always
  /// stops, and returns the group's error when it is broken (lent memory must then be kept).
  /// A lender is set only while no unit is gathered (units prefetched are dropped first):
  /// kFailedPrecondition otherwise, below stage 3 or before Finalize; kInvalidArgument for a
  /// lender with only one function.
  virtual Status LendGatheredMemory(GatheredMemoryLender lender) = 0;

  /// Collective, between steps: does now what the first BeginIteration does to the params
  /// (guard.init_params): every rank's become rank 0's ("broadcast"), or are checked equal
  /// ("verify"; always at stage 3, for the values given to SetParam). The next BeginIteration
  /// compares them again, so values written into the ParamData views before it still count.
  /// For a trainer that may compute with the params before its first BeginIteration (PyTorch:
  /// a forward through another method than the model's own). kFailedPrecondition inside an
  /// iteration, between the micro-batches of one step, or before Finalize.
  virtual Status SyncReplicas() = 0;
  /// Starts a micro-batch.
  virtual Status BeginIteration() = 0;
  /// A view into which this micro-batch's gradient for `id` is added (device memory on device
  /// "cuda"; write it on the SetStream stream before GradReady). It holds the param's gradient
  /// dtype: the param's own when precision.grad equals it, fp32 when precision.grad is fp32 (so
  /// a bf16 or fp16 param's view is fp32 under the default config: add the gradient widened).
  /// At stage 2 it lives in a bucket buffer; when the pool of buffers is exhausted the call
  /// waits for an in-flight reduction.
  virtual StatusOr<void*> GradBuffer(ParamId id) = 0;
  /// Declares `id`'s gradient for this micro-batch complete; its bucket's reduction starts
  /// once every param of the bucket and of every earlier bucket is ready.
  virtual Status GradReady(ParamId id) = 0;
  /// guard.on_unused = "zero": `id` gets no gradient in this micro-batch on this rank (an idle
  /// expert, a skipped branch), known before backward ends: it completes now with zeros, so its
  /// bucket does not wait for EndBackward, and unlike GradReady it does not count as used (a
  /// param no rank used in a step is still left untouched by it). kFailedPrecondition under
  /// on_unused = "error" or once the param got a gradient in this micro-batch.
  virtual Status GradAbsent(ParamId id) = 0;
  /// Adds `grad` (the param's dtype, full shape; host memory, or device memory on device
  /// "cuda") into the gradient and marks it ready. A bf16/fp16 gradient added into an fp32
  /// gradient (precision.grad fp32) is widened on the way and summed in fp32.
  virtual Status AccumulateGrad(ParamId id, const void* grad) = 0;
  /// AccumulateGrad for a caller that knows where `grad` lives: kDevice for memory of the
  /// engine's CUDA device (a CUDA tensor's data), kHost or kPinnedHost for host memory. The
  /// two-argument form asks the CUDA driver on a "cuda" engine (cudaPointerGetAttributes, per
  /// call); this one does not. kDevice on a "cpu" engine is kInvalidArgument.
  virtual Status AccumulateGrad(ParamId id, const void* grad, Placement placement) = 0;
  /// AccumulateGrad for a gradient the caller can leave where it is until the step: where a
  /// copy is all the engine would do with it (the param's first gradient in the step's last
  /// micro-batch; the gradient dtype, so no widening to fp32; and either one rank, so no
  /// reduction, or a param that fills its bucket alone: no other param, no padding, as a
  /// large bias-free weight whose size is a multiple of world size × 128 elements; at stage
  /// 3 a unit of one param), the engine reads `grad` where it is instead of copying it (one rank: in the next
  /// Step; several: its bucket's collective reads it in place of the bucket), counting none
  /// in grad_bytes_copied, and the caller leaves that memory unchanged until a
  /// Step returns successfully or the engine is destroyed. Returns whether the engine kept
  /// it; false: it was copied, exactly as by AccumulateGrad. A later gradient for the param
  /// in the same step copies the kept one first.
  virtual StatusOr<bool> LendGrad(ParamId id, const void* grad, Placement placement) = 0;
  /// Ends the micro-batch's backward: launches what is left, waits for the reductions.
  virtual Status EndBackward() = 0;
  /// Unscales, checks for overflow, clips, steps the rank's shard and gathers the params.
  /// kFailedPrecondition, changing nothing, when the ranks' group settings differ
  /// (SetGroupHyper). kAborted when an overflow finds the dynamic loss scale already at
  /// loss_scale.min (DeepSpeed ends the run there); that step is skipped as any overflow's.
  virtual StatusOr<StepInfo> Step() = 0;
  /// Drops the gradients of every micro-batch ended since the last Step (the trainer skips
  /// this step: a batch it rejects after its backward, or gradients a GAN's generator pass
  /// left in the discriminator's engine): the next micro-batch starts a new step, and the
  /// params, moments, step count and loss scale are as they were. Collective: every rank
  /// calls it (stage 3 gathers its persistent units again, as after a step).
  /// kFailedPrecondition inside a micro-batch (call EndBackward first). No-op with nothing
  /// to drop.
  virtual Status DropGradients() = 0;
  /// A micro-batch whose backward did not finish (an exception the trainer caught, skipping
  /// the batch): ends it, the gradients that did not arrive counting as zeros, then
  /// DropGradients. Collective: every rank skips that micro-batch, each with this call or,
  /// where its backward finished, with EndBackward then DropGradients. At stage 3 the
  /// backward's gathers are collectives too: a backward that stopped halfway on one rank
  /// while its peers' went on leaves their gathers unmatched, so there every rank's backward
  /// must stop (or none). Between micro-batches it is DropGradients.
  virtual Status AbandonMicroBatch() = 0;
  /// The global gradient norm of the last Step (StepInfo::grad_norm), read from the device
  /// when Step left it there (Config::sync_grad_norm false: one wait for the device, then
  /// kept). kFailedPrecondition before the first Step.
  virtual StatusOr<float> LastGradNorm() = 0;
  /// FSDP's clip_grad_norm_: between the step's last EndBackward and Step, the global L2
  /// norm of the gradient the next Step applies (summed over the micro-batches, averaged
  /// over the ranks, loss scale divided out), and that Step clips it to `max_norm` instead
  /// of Config::clip_grad_norm (0 or +inf: no clipping; later steps use the config's again).
  /// Collective: every rank calls it with the same `max_norm` (kInvalidArgument on every
  /// rank naming both values, or a negative or NaN one on any rank; nothing changed); the
  /// host waits for the norm. The norm is not finite when a gradient is Inf/NaN.
  /// kFailedPrecondition elsewhere than before a Step.
  virtual StatusOr<float> ClipGradNorm(float max_norm) = 0;
  /// Copies the full fp32 `state` of trainable param `id` (its numel floats, in host
  /// memory `out`) on every rank, wherever its parts live (DeepSpeed's
  /// safe_get_full_fp32_param, safe_get_full_optimizer_state and safe_get_full_grad).
  /// Collective at stages 1-3 (every rank asks for the same param and state). kGrad exists
  /// between the step's last EndBackward and Step (zeros for a param no rank used under
  /// guard.on_unused "zero", which that Step leaves untouched). kNotFound for a moment the optimizer
  /// does not keep (SGD without momentum keeps none, Lion and SGD no second);
  /// kFailedPrecondition for a frozen param, before Finalize, inside a micro-batch, or for
  /// kGrad elsewhere.
  virtual Status GetFullState(ParamId id, ParamState state, float* out) = 0;
  /// Sets the full fp32 `state` (kWeights or a moment) of trainable param `id` from its numel
  /// floats in host memory `values` (DeepSpeed's safe_set_full_fp32_param and
  /// safe_set_full_optimizer_state): each rank keeps its part, exactly. kWeights also sets
  /// the param itself (rounded to its dtype: the whole replica at stages 0-2, the rank's shard
  /// at stage 3). Collective: every rank calls it with the same values (the next iteration
  /// compares the ranks' params, as after SetParam, and at stages 0-2 repairs them). Between micro-batches, as GetFullState;
  /// kInvalidArgument for kGrad (the gradient comes from backward), kNotFound for a moment the
  /// optimizer does not keep, kFailedPrecondition for a frozen param and for SGD's momentum
  /// before the param's first step (which starts it from the gradient).
  virtual Status SetFullState(ParamId id, ParamState state, const float* values) = 0;

  /// Writes a checkpoint into directory `dir`: every rank its own shard of the fp32 weights
  /// and optimizer moments (`rank-R-of-N.bin`, an index of its records first, each record
  /// with its checksum), rank 0 the metadata (`meta.json`: params, step, loss scale, user
  /// data). Frozen params are saved only with checkpoint.save_frozen (their weights, no
  /// moments). Crash-safe: written into `dir.partial`, synced, then swapped in as `dir` in one
  /// rename, so `dir` always holds a complete checkpoint (the previous one until the swap).
  /// Collective; between steps (after Step()). A rank that fails makes every rank fail
  /// (kAborted naming it), and nothing is published.
  virtual Status SaveCheckpoint(const std::string& dir) = 0;
  /// Writes checkpoint `root/tag` as above, then points `root/latest` at it (replaced in one
  /// rename once every rank has finished), then deletes the oldest saves of `root` beyond
  /// `checkpoint.keep_last` (by the order they were saved in, not by step: after a rollback
  /// the new saves count as the newest and an abandoned later step ages like any other; only
  /// tags that end in a number, e.g. "step-1000": a tag such as "best" is never deleted nor
  /// counted). LoadCheckpoint(root) loads the latest. `tag` is a plain file
  /// name; otherwise kInvalidArgument. `dir` may be a symlink: the checkpoint is written where
  /// it points.
  virtual Status SaveCheckpoint(const std::string& root, const std::string& tag) = 0;
  /// Restores a checkpoint written at any world size and any stage (`dir` itself, or the one
  /// `dir/latest` names). Each rank reads every file's index and only the records that overlap
  /// its own shard, checking each record's checksum (counters().checkpoint_bytes_read). The
  /// trainable params registered must match the checkpoint's (names, shapes, dtypes; errors
  /// name the first difference). Frozen params are matched by name: those the checkpoint
  /// saved are set (a shape that differs is kInvalidArgument), the others keep their values. A damaged or missing file is kDataLoss naming it; the engine is unchanged on
  /// every rank when any rank fails. Collective; after Finalize, between steps.
  virtual Status LoadCheckpoint(const std::string& dir) = 0;
  /// The trainer's own state (data position, RNG seeds: any UTF-8 text, e.g. JSON) to save
  /// inside the next checkpoints, so that it can never disagree with the engine's state after a
  /// crash. Rank 0's value is the one written (other bytes: SaveCheckpoint refuses them before
  /// it writes anything). Empty by default.
  virtual void set_checkpoint_user_data(std::string data) = 0;
  /// The trainer state of the checkpoint last loaded (empty when none was loaded or it held
  /// none).
  virtual const std::string& checkpoint_user_data() const = 0;

  /// Whether any rank has been asked to stop (a preemption signal received after
  /// InstallPreemptionHandler(), or RequestPreemption(); zero/preemption.h): the same answer on
  /// every rank, so that all of them save a checkpoint at the same step boundary and exit.
  /// Collective (one small all-reduce); call it between steps, e.g. once per step.
  virtual StatusOr<bool> PreemptionRequested() = 0;

  /// Optimizer groups: one more than the largest ParamSpec::group registered, or the length of
  /// optimizer.param_groups if that is larger.
  virtual int num_groups() const = 0;
  /// The hyperparameters group `group` steps with next (kInvalidArgument for a group that
  /// does not exist). With a scheduler, its lr is the schedule's for the next step.
  virtual StatusOr<OptimizerHyper> GroupHyper(int group) const = 0;
  /// Sets group `group`'s hyperparameters for the following steps: kernel arguments, nothing
  /// is recomputed (but SGD built without momentum allocates its momentum buffer when a
  /// group's momentum turns nonzero: kResourceExhausted without the memory). Outside BeginIteration … EndBackward (Step reads them); the config's ranges apply
  /// (kInvalidArgument naming the field). Every rank must set the same values: Step refuses
  /// settings that differ between ranks where its host reads the step's values anyway (on
  /// the CPU always; on a GPU with sync_grad_norm or a loss scale). A scheduler
  /// overwrites the lr again after the next step.
  virtual Status SetGroupHyper(int group, const OptimizerHyper& hyper) = 0;
  /// The learning-rate schedule's position: DeepSpeed's last_batch_iteration, steps_taken() - 1
  /// (applied steps, including those of a loaded checkpoint, so a checkpoint restores it at any
  /// world size). -1 without a scheduler.
  virtual int64_t lr_schedule_iteration() const = 0;

  /// Bytes held now and at peak, per category.
  virtual MemoryStats GetMemoryStats() const = 0;
  /// What the engine has done so far.
  virtual EngineCounters counters() const = 0;
  /// The loss scale to multiply the next loss by (1 without loss scaling); after
  /// LoadCheckpoint, the checkpoint's.
  virtual float loss_scale() const = 0;
  /// Optimizer steps taken (skipped steps not counted), including those of a loaded checkpoint.
  virtual int64_t steps_taken() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// Number of registered params.
  virtual int64_t num_params() const = 0;
};

}  // namespace zero

#endif  // ZERO_ENGINE_H_
