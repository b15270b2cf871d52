// DeepSpeed's learning-rate schedules (WarmupLR, WarmupDecayLR, WarmupCosineLR) with the lr
// DeepSpeed's engine uses at every step (internal to runtime).
#ifndef ZERO_RUNTIME_LR_SCHEDULE_H_
#define ZERO_RUNTIME_LR_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "zero/config.h"

namespace zero::runtime {

/// A schedule over the optimizer groups. Positions are DeepSpeed's `last_batch_iteration`:
/// -1 when the schedule is built, then 0, 1, 2, ... after each applied optimizer step (the
/// engine advances it after a step that was not skipped, as DeepSpeed's engine does).
class LrSchedule {
 public:
  /// `base_lrs`: each group's lr as configured (WarmupCosineLR multiplies them by its ratio;
  /// WarmupLR and WarmupDecayLR set every group from warmup_min_lr / warmup_max_lr). The config
  /// is assumed valid (Config::Validate).
  LrSchedule(const SchedulerConfig& config, std::vector<float> base_lrs);

  /// The lr group `group` holds while the schedule is at `last_batch_iteration` (≥ -1): at -1,
  /// what DeepSpeed's constructor puts in the optimizer; after that, what its step() sets.
  float Lr(int64_t last_batch_iteration, int group) const;

 private:
  SchedulerConfig config_;
  std::vector<float> base_lrs_;
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_LR_SCHEDULE_H_
