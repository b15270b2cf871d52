// Loss scaling for fp16 training, with DeepSpeed's dynamic semantics: the scale starts at
// 2^initial_power; an overflow (Inf/NaN in any rank's gradient) skips the step and halves the
// scale once `hysteresis` overflows have been absorbed (never below `min`: an overflow that
// would go below it ends the run, Engine::Step's kAborted); `window` steps without overflow
// double it again.
#ifndef ZERO_RUNTIME_LOSS_SCALER_H_
#define ZERO_RUNTIME_LOSS_SCALER_H_

#include <cstdint>

#include "zero/config.h"

namespace zero::runtime {

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& config);

  /// The scale the trainer multiplies its loss by (1 with mode "none").
  float scale() const { return scale_; }
  /// True when overflowing gradients make the step skip (static and dynamic modes).
  bool skips_on_overflow() const { return mode_ != LossScaleMode::kNone; }
  /// Records one step's outcome and adjusts the scale (dynamic mode only).
  void Update(bool overflow);
  /// Dynamic mode: whether an overflow now would halve a scale already at `min` (DeepSpeed's
  /// DynamicLossScaler then ends the run: the gradients overflow whatever the scale). A scale
  /// below `min` (an initial power below it) is raised to it instead, as DeepSpeed's.
  bool OverflowWouldGoBelowMinimum() const {
    return mode_ == LossScaleMode::kDynamic && (hysteresis_ == 1 || remaining_hysteresis_ == 1) && scale_ == min_;
  }

  /// Everything that evolves, for checkpoints.
  struct State {
    float scale;
    int remaining_hysteresis;
    int64_t iteration, last_overflow;
    LossScaleMode mode = LossScaleMode::kDynamic;  ///< the saving scaler's (older files: dynamic)
  };
  State state() const { return {scale_, remaining_hysteresis_, iteration_, last_overflow_, mode_}; }
  /// A dynamic scaler's saved state, taken by a dynamic scaler only: modes "none" and "static"
  /// keep the scale their config gives (a saved dynamic scale must not divide the gradients of
  /// an engine configured without it), and a dynamic scaler starts from its config when the
  /// checkpoint's scaler was not dynamic (a bf16 run's scale 1 would make fp16 gradients
  /// underflow for thousands of steps). The caller has range-checked `s` (ReadCheckpointMeta).
  void Restore(const State& s) {
    if (mode_ != LossScaleMode::kDynamic || s.mode != LossScaleMode::kDynamic) return;
    scale_ = s.scale < min_ ? min_ : s.scale;
    remaining_hysteresis_ = s.remaining_hysteresis;
    iteration_ = s.iteration;
    last_overflow_ = s.last_overflow;
  }

 private:
  LossScaleMode mode_;
  float scale_;
  int window_;
  int hysteresis_;
  int remaining_hysteresis_;
  float min_;
  int64_t iteration_ = 0;
  int64_t last_overflow_ = -1;
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_LOSS_SCALER_H_
