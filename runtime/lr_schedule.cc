// DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR (deepspeed/runtime/lr_schedules.py,
// v0.19.3 and later), computed in double like DeepSpeed's Python and rounded to float at the end.
// it = last_batch_iteration, W = max(2, warmup_num_steps) (DeepSpeed's clamp; it rejects 0),
// T = total_num_steps, and for 0 <= it < W the warmup progress is
//   p(it) = ln(it + 1) / ln(W) (log; p(W - 1) = 1)   or   it / W (linear).
// WarmupLR (get_lr, _get_gamma): it < 0: min_lr; else min_lr + (max_lr - min_lr) * g, where
//   g = p(it) while it < W, then 1. max_lr not given: each group's configured lr (WarmupLR,
//   DeepSpeed v0.19.4 and later) or 0.001 (WarmupDecayLR's default).
// WarmupDecayLR (_get_gamma): as WarmupLR, but after warmup g = max(0, (T - it) / max(1, T - W)),
//   so the lr is back at min_lr (not 0) from it = T on.
// WarmupCosineLR (get_lr, get_lr_ratio): it < 0: 0 in every group (not warmup_min_ratio); else
//   org_lr * r, org_lr = the group's configured lr, and
//   r = warmup_min_ratio + (1 - warmup_min_ratio) * p(it) while it < W, then
//   r = max(0, cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * q)) / 2),
//   q = min(1, (it - W + 1) / max(1, T - W)), so r = cos_min_ratio from it = T - 1 on.
// Ordering (deepspeed/runtime/engine.py): the scheduler's constructor sets the groups' lr for
// it = -1; _take_model_step runs optimizer.step() and then, unless the step overflowed (skipped),
// lr_scheduler.step(), which advances it by one and sets the lr for the next step. So the n-th
// applied optimizer step (n = 1, 2, ...) runs with Lr(n - 2); a skipped step advances nothing.
#include "runtime/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace zero::runtime {
namespace {

constexpr double kPi = 3.14159265358979323846;  ///< Python's math.pi, as a double

/// DeepSpeed's warmup length: max(2, warmup_num_steps), so that ln(W) > 0.
int64_t ClampedWarmupSteps(const SchedulerConfig& config) {
  return std::max<int64_t>(2, config.warmup_num_steps);
}

/// The warmup progress p(it) in [0, 1] for 0 <= it < warmup_steps. The log form multiplies by
/// 1 / ln(W) as DeepSpeed does (its inverse_log_warm_up), for the same rounding.
double WarmupProgress(WarmupType type, int64_t it, int64_t warmup_steps) {
  if (type == WarmupType::kLog) {
    return (1.0 / std::log(static_cast<double>(warmup_steps))) *
           std::log(static_cast<double>(it + 1));
  }
  return static_cast<double>(it) / static_cast<double>(warmup_steps);
}

/// WarmupLR / WarmupDecayLR's _get_gamma: the share of (max_lr - min_lr) added to min_lr.
double WarmupGamma(const SchedulerConfig& config, int64_t it) {
  const int64_t warmup_steps = ClampedWarmupSteps(config);
  if (it < warmup_steps) return WarmupProgress(config.warmup_type, it, warmup_steps);
  if (config.type == LrScheduleType::kWarmupLR) return 1.0;
  const double remaining = static_cast<double>(config.total_num_steps - it);
  const double decay_steps =
      std::max(1.0, static_cast<double>(config.total_num_steps - warmup_steps));
  return std::max(0.0, remaining / decay_steps);
}

/// WarmupCosineLR's get_lr_ratio for it >= 0: the factor on each group's configured lr.
double CosineRatio(const SchedulerConfig& config, int64_t it) {
  const int64_t warmup_steps = ClampedWarmupSteps(config);
  if (it < warmup_steps) {
    const double min_ratio = config.warmup_min_ratio;
    return min_ratio + WarmupProgress(config.warmup_type, it, warmup_steps) * (1.0 - min_ratio);
  }
  const double decay_steps_done = static_cast<double>(it - warmup_steps + 1);
  const double decay_steps =
      static_cast<double>(std::max<int64_t>(1, config.total_num_steps - warmup_steps));
  const double progress = std::min(1.0, decay_steps_done / decay_steps);
  const double cos_min_ratio = config.cos_min_ratio;
  const double cosine = (1.0 + std::cos(kPi * progress)) / 2.0;
  return std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * cosine);
}

}  // namespace

LrSchedule::LrSchedule(const SchedulerConfig& config, std::vector<float> base_lrs)
    : config_(config), base_lrs_(std::move(base_lrs)) {}

float LrSchedule::Lr(int64_t last_batch_iteration, int group) const {
  const int64_t it = last_batch_iteration;
  switch (config_.type) {
    case LrScheduleType::kWarmupLR:
    case LrScheduleType::kWarmupDecayLR: {
      const double min_lr = config_.warmup_min_lr;
      const double max_lr = config_.warmup_max_lr.value_or(
          config_.type == LrScheduleType::kWarmupLR ? base_lrs_[group] : 0.001f);
      if (it < 0) return static_cast<float>(min_lr);
      return static_cast<float>(min_lr + (max_lr - min_lr) * WarmupGamma(config_, it));
    }
    case LrScheduleType::kWarmupCosineLR: {
      if (it < 0) return 0.0f;
      const double configured_lr = base_lrs_[group];
      return static_cast<float>(configured_lr * CosineRatio(config_, it));
    }
    case LrScheduleType::kNone:
      break;
  }
  return base_lrs_[group];
}

}  // namespace zero::runtime
