// Engine configuration: the JSON below, or the same fields set in C++.
//
//   { "stage": 2, "device": "cpu",
//     "optimizer": {"type": "adamw", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
//                   "weight_decay": 0.01, "momentum": 0.0, "dampening": 0.0, "nesterov": false},
//     "precision": {"param": "fp32", "grad": "fp32", "reduce": "fp32", "master_weights": true},
//     "buckets": {"reduce_bucket_elems": 4000000, "first_bucket_elems": 1000000,
//                 "last_bucket_elems": 1000000, "overlap": true, "pool_buffers": 4},
//     "stage3": {"prefetch_elems": 50000000, "max_live_elems": 1000000000,
//                "persistence_threshold": 100000},
//     "gradient_accumulation_steps": 1, "clip_grad_norm": 0.0,
//     "loss_scale": {"mode": "none", "initial_power": 16, "window": 1000, "hysteresis": 2,
//                    "min": 1.0},
//     "guard": {"on_duplicate": "error", "on_unused": "error", "consistency_check": false,
//               "timeout_s": 600, "init_params": "broadcast", "replica_check_every": 0},
//     "checkpoint": {"keep_last": 0} }
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

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  float lr = 1e-3f;                    ///< [0, 1e6]
  float beta1 = 0.9f, beta2 = 0.999f;  ///< "betas", each in [0, 1); SGD ignores them
  float eps = 1e-8f;                   ///< (0, 1]
  float weight_decay = 0.01f;          ///< [0, 1e6]
  float momentum = 0.0f, dampening = 0.0f;  ///< SGD; each in [0, 1]
  bool nesterov = false;                    ///< SGD; needs momentum > 0 and dampening = 0
};

struct PrecisionConfig {
  DType param = DType::kFP32;   ///< the dtype params are expected in (each ParamSpec says its own)
  DType grad = DType::kFP32;    ///< gradient dtype; must equal each param's dtype for now
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
};

struct Stage3Config {
  int64_t prefetch_elems = 50'000'000;       ///< [0, 1e15]
  int64_t max_live_elems = 1'000'000'000;    ///< [1, 1e15]
  int64_t persistence_threshold = 100'000;   ///< [0, 1e15]
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

struct CheckpointConfig {
  /// SaveCheckpoint(root, tag) keeps this many newest checkpoints of `root` (by step) and
  /// deletes older ones once the new one is complete; 0 keeps all. [0, 2147483647]
  int keep_last = 0;
};

/// The whole configuration.
struct Config {
  int stage = 2;  ///< 0, 1, 2 or 3
  Device device = Device::kCpu;
  OptimizerConfig optimizer;
  PrecisionConfig precision;
  BucketConfig buckets;
  Stage3Config stage3;
  int gradient_accumulation_steps = 1;  ///< ≥ 1
  float clip_grad_norm = 0.0f;  ///< ≥ 0 and finite; 0: no clipping
  LossScaleConfig loss_scale;
  GuardConfig guard;
  CheckpointConfig checkpoint;

  /// Parses the JSON above; missing keys keep their defaults. Then Validate(). Text that is not
  /// JSON is kInvalidArgument with nlohmann's reason (line, column); a number beyond a double
  /// (1e999) names its key.
  static StatusOr<Config> FromJson(std::string_view json);
  /// Checks every value's range (the ranges above; NaN and ±Inf are never in one); errors name
  /// the key and the value.
  Status Validate() const;
};

/// Names as the JSON spells them.
const char* OptimizerTypeName(OptimizerType type);

}  // namespace zero

#endif  // ZERO_CONFIG_H_
