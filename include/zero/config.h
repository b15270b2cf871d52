// Engine configuration: the JSON below, or the same fields set in C++.
//
//   { "stage": 2, "device": "cpu",
//     "optimizer": {"type": "adamw", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
//                   "weight_decay": 0.01, "momentum": 0.0, "dampening": 0.0, "nesterov": false,
//                   "param_groups": [{"weight_decay": 0.1}, {"lr": 1e-4, "weight_decay": 0.0}]},
//     "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 1000,
//                   "warmup_num_steps": 100, "warmup_type": "linear"}},
//     "precision": {"param": "fp32", "grad": "fp32", "reduce": "fp32", "master_weights": true},
//     "buckets": {"reduce_bucket_elems": 4000000, "first_bucket_elems": 1000000,
//                 "last_bucket_elems": 1000000, "overlap": true, "pool_buffers": 4,
//                 "grow_pool": true},
//     "stage3": {"prefetch_elems": 50000000, "max_live_elems": 1000000000,
//                "persistence_threshold": 100000, "max_reuse_elems": 1000000000},
//     "gradient_accumulation_steps": 1, "clip_grad_norm": 0.0, "sync_grad_norm": true,
//     "loss_scale": {"mode": "none", "initial_power": 16, "window": 1000, "hysteresis": 2,
//                    "min": 1.0},
//     "guard": {"on_duplicate": "error", "on_unused": "error", "consistency_check": false,
//               "timeout_s": 600, "init_params": "broadcast", "replica_check_every": 0},
//     "checkpoint": {"keep_last": 0, "save_frozen": false},
//     "batch": {"train_batch_size": 0, "micro_batch_size_per_rank": 0} }
//
// Every key is optional. Unknown keys, wrong types and out-of-range values are
// kInvalidArgument naming the key as a dotted path (e.g. `buckets.reduce_bucket_elems`,
// `optimizer.betas[1]`), quoting the value as written and saying what is allowed. Every number
// must be finite; integer keys take whole numbers only (3 or 3.0, not 2.5); a nonzero value
// that a float key would store as 0 or a subnormal (e.g. `"lr": 1e-300`) is refused, not
// flushed. The ranges are on each field below; everything they admit, the optimizer kernels
// accept.
#ifndef ZERO_CONFIG_H_
#define ZERO_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <optional>
#include <vector>

#include "zero/device.h"
#include "zero/dtype.h"
#include "zero/status.h"

namespace zero {

/// optimizer.type
enum class OptimizerType : int { kAdam, kAdamW, kSgd, kLamb, kLion };
/// loss_scale.mode
enum class LossScaleMode : int { kNone, kStatic, kDynamic };
/// guard.on_duplicate: a second gradient for a param in one iteration.
enum class DuplicatePolicy : int { kError, kCount };
/// guard.on_unused: a param that got no gradient in an iteration.
enum class UnusedPolicy : int { kError, kZero };
/// guard.init_params: what the first iteration does when ranks set different initial params.
enum class InitParams : int { kBroadcast, kVerify };

/// The hyperparameters one optimizer group steps with. Each optimizer reads its own: Adam and
/// AdamW lr, betas, eps, weight_decay; SGD lr, momentum, dampening, nesterov, weight_decay;
/// LAMB lr, betas, eps, weight_decay; Lion lr, betas, weight_decay.
struct OptimizerHyper {
  float lr = 1e-3f;                    ///< [0, 1e6]
  float beta1 = 0.9f, beta2 = 0.999f;  ///< "betas", each in [0, 1); SGD ignores them
  float eps = 1e-8f;                   ///< (0, 1]
  /// [0, 1e6]. 0.01 here (AdamW's); a JSON config that sets none gets its type's default:
  /// 0.01 for AdamW, 0 for Adam, SGD, LAMB and Lion (PyTorch's and the reference ones).
  float weight_decay = 0.01f;
  float momentum = 0.0f, dampening = 0.0f;  ///< SGD; each in [0, 1]
  bool nesterov = false;                    ///< SGD; needs momentum > 0 and dampening = 0
};

/// optimizer.param_groups[g]: the keys group g sets (the JSON's names: "lr", "betas", "eps",
/// "weight_decay", "momentum", "dampening", "nesterov"); the others are the optimizer's own.
struct ParamGroupOverrides {
  std::optional<float> lr, beta1, beta2, eps, weight_decay, momentum, dampening;
  std::optional<bool> nesterov;
};

/// optimizer: the type, the hyperparameters every group starts from (the fields inherited
/// from OptimizerHyper), and per-group overrides indexed by ParamSpec::group.
struct OptimizerConfig : OptimizerHyper {
  OptimizerType type = OptimizerType::kAdamW;
  /// At most 65536 entries; a group beyond the list steps with the optimizer's own values.
  std::vector<ParamGroupOverrides> param_groups;

  /// Group `group`'s hyperparameters: the optimizer's own with param_groups[group] applied.
  OptimizerHyper Group(int group) const;
};

/// scheduler.type: DeepSpeed's learning-rate schedules (deepspeed/runtime/lr_schedules.py).
enum class LrScheduleType : int { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
/// scheduler.params.warmup_type
enum class WarmupType : int { kLog, kLinear };

/// "scheduler": {"type": "WarmupLR" | "WarmupDecayLR" | "WarmupCosineLR", "params": {...}},
/// with DeepSpeed's names, defaults and lr at every step. The schedule starts at iteration -1
/// (DeepSpeed's last_batch_iteration) and advances after each applied optimizer step (a step
/// skipped for overflow does not advance it); it sets every group's lr before each step.
struct SchedulerConfig {
  LrScheduleType type = LrScheduleType::kNone;
  /// WarmupLR, WarmupDecayLR: lr from warmup_min_lr to warmup_max_lr over warmup_num_steps,
  /// then constant (WarmupLR) or linearly back down to warmup_min_lr at total_num_steps
  /// (WarmupDecayLR). Not given, warmup_max_lr is each group's own lr (WarmupLR) or 0.001
  /// (WarmupDecayLR), as in DeepSpeed.
  float warmup_min_lr = 0.0f;                ///< [0, 1e6]
  std::optional<float> warmup_max_lr;        ///< [0, 1e6]
  int64_t warmup_num_steps = 1000;   ///< [0, 1e15]; below 2 counts as 2 (DeepSpeed's clamp)
  WarmupType warmup_type = WarmupType::kLog;
  /// WarmupDecayLR and WarmupCosineLR: required (≥ 1). Not above warmup_num_steps, the decay
  /// is immediate (DeepSpeed only warns too).
  int64_t total_num_steps = 0;
  /// WarmupCosineLR: each group's lr times a ratio that warms up from warmup_min_ratio to 1,
  /// then follows a cosine down to cos_min_ratio at total_num_steps.
  float warmup_min_ratio = 0.0f;     ///< [0, 1]
  float cos_min_ratio = 0.0001f;     ///< [0, 1]
};

struct PrecisionConfig {
  DType param = DType::kFP32;   ///< the dtype params are expected in (each ParamSpec says its own)
  /// Gradient accumulation dtype of 16-bit params: their own dtype (bf16 or fp16, as it was the
  /// only choice before), or fp32 (DeepSpeed's data_types.grad_accum_dtype "fp32", FSDP's
  /// reduce_dtype float32): micro-batches are summed and reduced in fp32. fp32 params always
  /// accumulate in fp32. Each param's gradient dtype is max(param dtype, this).
  DType grad = DType::kFP32;
  DType reduce = DType::kFP32;  ///< dtype on the wire; must equal the gradient dtype for now
  bool master_weights = true;   ///< fp32 master copy for 16-bit params (false: unimplemented)
};

struct BucketConfig {
  /// [1, 1e15]. Smaller buckets start their reduction earlier in backward and hide more of it;
  /// larger ones pay less per-collective latency. With 4M elements (16 MiB fp32), stage 2 left
  /// about one to two buckets' reduce-scatter exposed after backward in zero_bench_iteration
  /// (README, "Choosing bucket sizes").
  int64_t reduce_bucket_elems = 4'000'000;
  int64_t first_bucket_elems = 1'000'000;    ///< [1, 1e15]
  /// [0, 1e15]; 0: no cap of its own. The last bucket to fill in backward (the first-registered
  /// params) is what stays to reduce after backward ends: a small one leaves little exposed.
  /// The cap is at least the first-registered param's size plus a quarter (its bias with it).
  int64_t last_bucket_elems = 1'000'000;
  bool overlap = true;    ///< launch a bucket's reduction as soon as it is ready
  int pool_buffers = 4;   ///< stage 2: bucket buffers being filled or in flight at once (≥ 1)
                          ///< (without overlap: one per bucket, whatever this says)
  /// Stages 2-3: when every pool buffer is held by buckets still being filled and no
  /// reduction is in flight to free one (gradients arriving far from backward order, or a
  /// param whose gradient comes late holding its bucket back), allocate one more, up to one
  /// per bucket, logged once and counted (EngineCounters::pool_buffers_added), as DeepSpeed
  /// and DDP reduce in any arrival order. false: that micro-batch fails with
  /// kResourceExhausted naming the params its next bucket waits for, and the pool never
  /// exceeds pool_buffers.
  bool grow_pool = true;
};

struct Stage3Config {
  /// Elements of units gathered ahead of the trainer's Gather (DeepSpeed's
  /// stage3_prefetch_bucket_size); also the most elements of released units' buffers kept for
  /// reuse by later gathers (within max_live_elems with the gathered units). [0, 1e15]
  int64_t prefetch_elems = 50'000'000;
  /// Gathered elements beyond which kept and prefetched units are freed and no more are
  /// prefetched (DeepSpeed's stage3_max_live_parameters); a unit the trainer gathers is
  /// gathered even past it (logged once). [1, 1e15]
  int64_t max_live_elems = 1'000'000'000;
  int64_t persistence_threshold = 100'000;   ///< [0, 1e15]
  /// A unit released until its backward (Engine::ReleaseUntilBackward) stays gathered when
  /// the recorded order gathers fewer than this many elements of other units before gathering
  /// it again (DeepSpeed's stage3_max_reuse_distance), within max_live_elems; 0 keeps none.
  /// [0, 1e15]
  int64_t max_reuse_elems = 1'000'000'000;
};

struct LossScaleConfig {
  LossScaleMode mode = LossScaleMode::kNone;
  int initial_power = 16;  ///< initial scale 2^initial_power; [0, 64]
  int window = 1000;       ///< steps without overflow before the scale doubles (≥ 1)
  int hysteresis = 2;      ///< overflows tolerated before the scale halves (≥ 1)
  float min = 1.0f;        ///< the scale never drops below this; (0, 2^64]
};

struct GuardConfig {
  DuplicatePolicy on_duplicate = DuplicatePolicy::kError;
  UnusedPolicy on_unused = UnusedPolicy::kError;
  bool consistency_check = false;
  /// A collective that takes longer is kDeadlineExceeded; 0: wait forever. [0, 604800] (one
  /// week), so that the deadline always fits a std::chrono clock.
  double timeout_s = 600.0;
  /// At the first iteration (BeginIteration, or Gather at stage 3) the ranks compare a hash of
  /// each param. kBroadcast: params that differ from rank 0's get rank 0's values (as DDP and
  /// DeepSpeed do when they wrap a model). kVerify: a difference is kInvalidArgument naming the
  /// first differing param and ranks. Stage 3 compares the values given to SetParam and cannot
  /// repair them: a difference is an error in both modes.
  InitParams init_params = InitParams::kBroadcast;
  /// > 0: every that many steps (after Step) the ranks compare a hash of their params;
  /// replicas that differ are kDataLoss naming the first differing param (stages 0-2; at stage
  /// 3 the ranks hold different shards, nothing to compare). Costs one read of the params.
  int replica_check_every = 0;  ///< ≥ 0
};

/// "batch": DeepSpeed's train_batch_size and train_micro_batch_size_per_gpu, checked by
/// Engine::Create: train_batch_size = micro_batch_size_per_rank × gradient_accumulation_steps ×
/// world size (without the micro-batch size, a multiple of the other two). 0: not given.
struct BatchConfig {
  int64_t train_batch_size = 0;           ///< [0, 1e15]
  int64_t micro_batch_size_per_rank = 0;  ///< [0, 1e15]
};

struct CheckpointConfig {
  /// SaveCheckpoint(root, tag) keeps this many newest saves of `root` with numbered tags (by
  /// the order they were saved in) and deletes older ones once the new one is complete; 0
  /// keeps all. [0, 2147483647]
  int keep_last = 0;
  /// Checkpoints hold the frozen params' values too (requires_grad = false; their records
  /// hold weights, no moments), so that a load sets them and zero-ckpt consolidate gives
  /// them back. Off: checkpoints hold trainable params only (a LoRA job's checkpoint is its
  /// adapters), and a load leaves frozen params as they are.
  bool save_frozen = false;
};

/// The whole configuration.
struct Config {
  int stage = 2;  ///< 0, 1, 2 or 3
  Device device = Device::kCpu;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  PrecisionConfig precision;
  BucketConfig buckets;
  Stage3Config stage3;
  int gradient_accumulation_steps = 1;  ///< ≥ 1
  float clip_grad_norm = 0.0f;  ///< ≥ 0 and finite; 0: no clipping
  /// Whether Step() brings the global gradient norm to the host for StepInfo::grad_norm. On
  /// device "cuda" that is the one wait for the GPU in a steady step (the norm and clipping
  /// are decided on the device either way); false leaves StepInfo::grad_norm NaN and
  /// Engine::LastGradNorm() reads it when asked. Dynamic loss scaling reads the overflow flag
  /// on the host regardless. No effect on device "cpu", where the norm is on the host anyway.
  bool sync_grad_norm = true;
  LossScaleConfig loss_scale;
  GuardConfig guard;
  CheckpointConfig checkpoint;
  BatchConfig batch;
  /// Lines about the config for the log (e.g. DeepSpeed keys that only tune DeepSpeed's own
  /// internals, accepted and ignored); Engine::Create logs them at INFO.
  std::vector<std::string> notes;

  /// Parses the JSON above, or a DeepSpeed config (recognised by its top-level keys, e.g.
  /// zero_optimization, bf16, train_batch_size; translated first, with every unsupported key
  /// named in one error); missing keys keep their defaults ("{}": all of them; empty text is an
  /// error). Then Validate(). Text that is not
  /// JSON is kInvalidArgument with nlohmann's reason (line, column); a number beyond a double
  /// (1e999) names its key.
  static StatusOr<Config> FromJson(std::string_view json);
  /// Checks every value's range (the ranges above; NaN and ±Inf are never in one); errors name
  /// the key and the value.
  Status Validate() const;
};

/// `json` as ZeroRT's JSON: a DeepSpeed config translated (the translation FromJson makes),
/// a ZeroRT config as it is; either checked as FromJson checks it (empty text is refused, as
/// there: "{}" gives the defaults).
StatusOr<std::string> NormalizeConfigJson(std::string_view json);

/// Whether `json` is a DeepSpeed config, as FromJson tells them apart (DeepSpeed's own
/// top-level keys, an optimizer with "params", DeepSpeed's checkpoint keys); false for text
/// that is not a JSON object.
bool IsDeepSpeedConfigJson(std::string_view json);

/// Checks one group's hyperparameters against the config's ranges; errors name the field as
/// `where`.lr, `where`.betas[0], ...
Status ValidateOptimizerHyper(const OptimizerHyper& hyper, const std::string& where);

/// Names as the JSON spells them.
const char* OptimizerTypeName(OptimizerType type);

}  // namespace zero

#endif  // ZERO_CONFIG_H_
