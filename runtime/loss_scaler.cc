// DeepSpeed-compatible dynamic loss scaling.
#include "runtime/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace zero::runtime {

LossScaler::LossScaler(const LossScaleConfig& config)
    : mode_(config.mode),
      scale_(config.mode == LossScaleMode::kNone ? 1.0f
                                                 : std::ldexp(1.0f, config.initial_power)),
      window_(config.window),
      hysteresis_(config.hysteresis),
      remaining_hysteresis_(config.hysteresis),
      min_(config.min) {}

void LossScaler::Update(bool overflow) {
  if (mode_ == LossScaleMode::kDynamic) {
    if (overflow) {
      if (hysteresis_ == 1 || remaining_hysteresis_ == 1) {
        scale_ = std::max(scale_ / 2.0f, min_);
      } else {
        --remaining_hysteresis_;
      }
      last_overflow_ = iteration_;
    } else if ((iteration_ - last_overflow_) % window_ == 0) {
      remaining_hysteresis_ = hysteresis_;
      scale_ = std::min(scale_ * 2.0f, 0x1p64f);  // the largest scale a checkpoint takes back
    }
  }
  ++iteration_;
}

}  // namespace zero::runtime
