// runtime::LrSchedule against DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR
// (deepspeed/runtime/lr_schedules.py): every step of whole schedules, log and linear warmup,
// against a float64 transcription of DeepSpeed's scheduler objects written here; hand-computed
// values at the landmarks (construction, end of warmup, end of decay, past total_num_steps);
// DeepSpeed's max(2, warmup_num_steps) clamp; two groups with different lrs under WarmupCosineLR.
#include "runtime/lr_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace zero::runtime {
namespace {

constexpr double kRelativeTolerance = 1e-6;

/// `got` within kRelativeTolerance of `want` (so a `want` of 0 must be exactly 0).
::testing::AssertionResult LrNear(float got, double want) {
  if (std::abs(static_cast<double>(got) - want) <= kRelativeTolerance * std::abs(want)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "lr " << got << ", DeepSpeed's " << want;
}

/// DeepSpeed's scheduler object in float64, transcribed from lr_schedules.py: the constructor
/// writes the lr for last_batch_iteration = -1 into every param group, and each step() advances
/// last_batch_iteration by one and writes the new lrs.
class DeepSpeedScheduler {
 public:
  DeepSpeedScheduler(const SchedulerConfig& config, const std::vector<float>& group_lrs)
      : config_(config),
        warmup_num_steps_(std::max<int64_t>(2, config.warmup_num_steps)),
        org_lrs_(group_lrs.begin(), group_lrs.end()),
        param_group_lrs_(org_lrs_) {
    WriteParamGroupLrs();
  }

  void Step() {
    ++last_batch_iteration_;
    WriteParamGroupLrs();
  }

  double param_group_lr(int group) const { return param_group_lrs_[group]; }

 private:
  void WriteParamGroupLrs() {
    for (size_t g = 0; g < param_group_lrs_.size(); ++g) param_group_lrs_[g] = GetLr(g);
  }

  // The log or linear warmup curve, 0 at iteration 0.
  double WarmupCurve() const {
    const double it = static_cast<double>(last_batch_iteration_);
    if (config_.warmup_type == WarmupType::kLog) {
      return std::log(it + 1) / std::log(static_cast<double>(warmup_num_steps_));
    }
    return it / static_cast<double>(warmup_num_steps_);
  }

  double GetLr(size_t group) const {
    const int64_t it = last_batch_iteration_;
    const int64_t total = config_.total_num_steps;
    if (config_.type == LrScheduleType::kWarmupCosineLR) {
      if (it < 0) return 0.0;
      double ratio;
      if (it < warmup_num_steps_) {
        ratio = config_.warmup_min_ratio + WarmupCurve() * (1.0 - config_.warmup_min_ratio);
      } else {
        double progress = static_cast<double>(it - warmup_num_steps_ + 1) /
                          static_cast<double>(std::max<int64_t>(1, total - warmup_num_steps_));
        if (progress > 1.0) progress = 1.0;
        ratio = config_.cos_min_ratio +
                (1.0 - config_.cos_min_ratio) * (1.0 + std::cos(std::acos(-1.0) * progress)) / 2.0;
        if (ratio < 0.0) ratio = 0.0;
      }
      return org_lrs_[group] * ratio;
    }
    const double min_lr = config_.warmup_min_lr;
    // DeepSpeed's warmup_max_lr=None: each group's own lr (WarmupLR); WarmupDecayLR's default.
    const double max_lr = config_.warmup_max_lr.value_or(
        config_.type == LrScheduleType::kWarmupLR ? org_lrs_[group] : 0.001);
    if (it < 0) return min_lr;
    double gamma;
    if (it < warmup_num_steps_) {
      gamma = WarmupCurve();
    } else if (config_.type == LrScheduleType::kWarmupLR) {
      gamma = 1.0;
    } else {
      gamma = static_cast<double>(total - it) /
              static_cast<double>(std::max<int64_t>(1, total - warmup_num_steps_));
      if (gamma < 0.0) gamma = 0.0;
    }
    return min_lr + (max_lr - min_lr) * gamma;
  }

  SchedulerConfig config_;
  int64_t warmup_num_steps_;
  int64_t last_batch_iteration_ = -1;
  std::vector<double> org_lrs_;
  std::vector<double> param_group_lrs_;
};

/// Lr(it, g) for it = -1 .. last_iteration and every group equals DeepSpeed's group lr after
/// construction and it + 1 steps.
void ExpectMatchesDeepSpeed(const SchedulerConfig& config, const std::vector<float>& base_lrs,
                            int64_t last_iteration) {
  const LrSchedule schedule(config, base_lrs);
  DeepSpeedScheduler deepspeed(config, base_lrs);
  for (int64_t it = -1; it <= last_iteration; ++it) {
    if (it >= 0) deepspeed.Step();
    for (int g = 0; g < static_cast<int>(base_lrs.size()); ++g) {
      EXPECT_TRUE(LrNear(schedule.Lr(it, g), deepspeed.param_group_lr(g)))
          << "last_batch_iteration " << it << ", group " << g;
    }
  }
}

SchedulerConfig WarmupLR(WarmupType warmup_type, float min_lr, float max_lr, int64_t warmup) {
  SchedulerConfig c;
  c.type = LrScheduleType::kWarmupLR;
  c.warmup_type = warmup_type;
  c.warmup_min_lr = min_lr;
  c.warmup_max_lr = max_lr;
  c.warmup_num_steps = warmup;
  return c;
}

SchedulerConfig WarmupDecayLR(WarmupType warmup_type, float min_lr, float max_lr, int64_t warmup,
                              int64_t total) {
  SchedulerConfig c = WarmupLR(warmup_type, min_lr, max_lr, warmup);
  c.type = LrScheduleType::kWarmupDecayLR;
  c.total_num_steps = total;
  return c;
}

SchedulerConfig WarmupCosineLR(WarmupType warmup_type, float warmup_min_ratio, float cos_min_ratio,
                               int64_t warmup, int64_t total) {
  SchedulerConfig c;
  c.type = LrScheduleType::kWarmupCosineLR;
  c.warmup_type = warmup_type;
  c.warmup_min_ratio = warmup_min_ratio;
  c.cos_min_ratio = cos_min_ratio;
  c.warmup_num_steps = warmup;
  c.total_num_steps = total;
  return c;
}

constexpr WarmupType kWarmupTypes[] = {WarmupType::kLog, WarmupType::kLinear};
const std::vector<float> kTwoGroups = {0.01f, 0.0004f};

TEST(LrSchedule, NoneKeepsEachGroupsConfiguredLr) {
  const LrSchedule schedule(SchedulerConfig{}, kTwoGroups);
  EXPECT_EQ(schedule.Lr(-1, 0), 0.01f);
  EXPECT_EQ(schedule.Lr(-1, 1), 0.0004f);
  EXPECT_EQ(schedule.Lr(12345, 1), 0.0004f);
}

TEST(LrSchedule, WarmupLRMatchesDeepSpeedAtEveryStep) {
  for (const WarmupType type : kWarmupTypes) {
    SCOPED_TRACE(static_cast<int>(type));
    ExpectMatchesDeepSpeed(WarmupLR(type, 1e-4f, 1e-2f, 10), kTwoGroups, 30);
  }
}

TEST(LrSchedule, WarmupLRLinearLandmarks) {
  const LrSchedule s(WarmupLR(WarmupType::kLinear, 1e-4f, 1e-2f, 10), kTwoGroups);
  EXPECT_TRUE(LrNear(s.Lr(-1, 0), 1e-4));       // constructor: min_lr
  EXPECT_TRUE(LrNear(s.Lr(0, 1), 1e-4));        // 1e-4 + 0.0099 * 0/10, every group alike
  EXPECT_TRUE(LrNear(s.Lr(5, 0), 0.00505));     // 1e-4 + 0.0099 * 5/10
  EXPECT_TRUE(LrNear(s.Lr(9, 0), 0.00901));     // 1e-4 + 0.0099 * 9/10
  EXPECT_TRUE(LrNear(s.Lr(10, 0), 0.01));       // warmup over: max_lr
  EXPECT_TRUE(LrNear(s.Lr(1000000, 0), 0.01));  // and it stays there
}

TEST(LrSchedule, WarmupLRLogLandmarks) {
  const LrSchedule s(WarmupLR(WarmupType::kLog, 1e-4f, 1e-2f, 10), kTwoGroups);
  EXPECT_TRUE(LrNear(s.Lr(-1, 0), 1e-4));  // constructor: min_lr
  EXPECT_TRUE(LrNear(s.Lr(0, 0), 1e-4));   // ln(1) / ln(10) = 0
  // 1e-4 + 0.0099 * ln(5) / ln(10) = 1e-4 + 0.0099 * 0.6989700043
  EXPECT_TRUE(LrNear(s.Lr(4, 0), 0.007019803042926586));
  EXPECT_TRUE(LrNear(s.Lr(9, 0), 0.01));  // ln(10) / ln(10) = 1: max_lr one step early
  EXPECT_TRUE(LrNear(s.Lr(10, 0), 0.01));
}

TEST(LrSchedule, WarmupDecayLRMatchesDeepSpeedAtEveryStep) {
  for (const WarmupType type : kWarmupTypes) {
    SCOPED_TRACE(static_cast<int>(type));
    ExpectMatchesDeepSpeed(WarmupDecayLR(type, 5e-4f, 3e-3f, 8, 30), kTwoGroups, 40);
  }
}

TEST(LrSchedule, WarmupDecayLRLinearLandmarks) {
  // min_lr 5e-4, max_lr 3e-3 (delta 0.0025), warmup 8, total 30 (decay over 30 - 8 = 22).
  const LrSchedule s(WarmupDecayLR(WarmupType::kLinear, 5e-4f, 3e-3f, 8, 30), kTwoGroups);
  EXPECT_TRUE(LrNear(s.Lr(-1, 0), 5e-4));                // constructor: min_lr
  EXPECT_TRUE(LrNear(s.Lr(0, 0), 5e-4));                 // 0/8
  EXPECT_TRUE(LrNear(s.Lr(4, 1), 0.00175));              // 5e-4 + 0.0025 * 4/8
  EXPECT_TRUE(LrNear(s.Lr(8, 0), 3e-3));                 // (30 - 8) / 22 = 1
  EXPECT_TRUE(LrNear(s.Lr(19, 0), 0.00175));             // (30 - 19) / 22 = 1/2
  EXPECT_TRUE(LrNear(s.Lr(29, 0), 0.0006136363636364));  // 5e-4 + 0.0025 / 22
  EXPECT_TRUE(LrNear(s.Lr(30, 0), 5e-4));                // (30 - 30) / 22 = 0: min_lr, not 0
  EXPECT_TRUE(LrNear(s.Lr(40, 0), 5e-4));                // max(0, -10/22) = 0
}

TEST(LrSchedule, WarmupDecayLRLogLandmarks) {
  const LrSchedule s(WarmupDecayLR(WarmupType::kLog, 5e-4f, 3e-3f, 8, 30), kTwoGroups);
  EXPECT_TRUE(LrNear(s.Lr(3, 0), 0.0021666666666667));  // 5e-4 + 0.0025 * ln(4)/ln(8) = * 2/3
  EXPECT_TRUE(LrNear(s.Lr(7, 0), 3e-3));                // ln(8) / ln(8) = 1
}

TEST(LrSchedule, WarmupCosineLRMatchesDeepSpeedAtEveryStepForEachGroup) {
  for (const WarmupType type : kWarmupTypes) {
    SCOPED_TRACE(static_cast<int>(type));
    ExpectMatchesDeepSpeed(WarmupCosineLR(type, 0.1f, 0.02f, 10, 40), kTwoGroups, 50);
  }
}

TEST(LrSchedule, WarmupCosineLRLinearLandmarksScaleEachGroup) {
  // Groups at 0.01 and 0.0004; warmup_min_ratio 0.1, cos_min_ratio 0.02, warmup 10, total 40.
  const LrSchedule s(WarmupCosineLR(WarmupType::kLinear, 0.1f, 0.02f, 10, 40), kTwoGroups);
  EXPECT_TRUE(LrNear(s.Lr(-1, 0), 0.0));  // constructor: 0, not warmup_min_ratio
  EXPECT_TRUE(LrNear(s.Lr(-1, 1), 0.0));
  EXPECT_TRUE(LrNear(s.Lr(0, 0), 0.001));     // 0.01 * 0.1
  EXPECT_TRUE(LrNear(s.Lr(0, 1), 0.00004));   // 0.0004 * 0.1
  EXPECT_TRUE(LrNear(s.Lr(5, 0), 0.0055));    // 0.01 * (0.1 + 0.9 * 5/10)
  EXPECT_TRUE(LrNear(s.Lr(9, 1), 0.000364));  // 0.0004 * (0.1 + 0.9 * 9/10)
  // First cosine step, progress (10 - 10 + 1) / 30: 0.01 * (0.02 + 0.98 * (1 + cos(pi/30)) / 2),
  // cos(pi/30) = 0.9945218953682733.
  EXPECT_TRUE(LrNear(s.Lr(10, 0), 0.00997315728730454));
  EXPECT_TRUE(LrNear(s.Lr(24, 0), 0.0051));     // progress 15/30: 0.01 * (0.02 + 0.98 / 2)
  EXPECT_TRUE(LrNear(s.Lr(24, 1), 0.000204));   // 0.0004 * 0.51
  EXPECT_TRUE(LrNear(s.Lr(39, 0), 0.0002));     // progress 30/30: cos_min_ratio at total - 1
  EXPECT_TRUE(LrNear(s.Lr(100, 1), 0.000008));  // progress clamped to 1: 0.0004 * 0.02
}

TEST(LrSchedule, WarmupCosineLRLogLandmarks) {
  const LrSchedule s(WarmupCosineLR(WarmupType::kLog, 0.1f, 0.02f, 10, 40), kTwoGroups);
  // 0.01 * (0.1 + 0.9 * ln(5)/ln(10)) = 0.01 * (0.1 + 0.9 * 0.6989700043)
  EXPECT_TRUE(LrNear(s.Lr(4, 0), 0.007290730039024168));
  EXPECT_TRUE(LrNear(s.Lr(9, 0), 0.01));  // ln(10) / ln(10) = 1
}

TEST(LrSchedule, WarmupCosineLRWithoutDecayStepsDropsToTheFloorAfterWarmup) {
  for (const int64_t total : {2, 4}) {
    SCOPED_TRACE(total);
    const SchedulerConfig config = WarmupCosineLR(WarmupType::kLog, 0.0f, 0.02f, 4, total);
    const LrSchedule s(config, kTwoGroups);
    EXPECT_TRUE(LrNear(s.Lr(3, 0), 0.01));    // ln(4) / ln(4) = 1
    EXPECT_TRUE(LrNear(s.Lr(4, 0), 0.0002));  // progress min(1, 1 / max(1, total - 4)) = 1
    EXPECT_TRUE(LrNear(s.Lr(50, 1), 0.000008));
    ExpectMatchesDeepSpeed(config, kTwoGroups, 10);
  }
}

// DeepSpeed warms up over max(2, warmup_num_steps) steps (it rejects 0 since v0.19.3; earlier
// versions clamped it like 1).
TEST(LrSchedule, WarmupOfZeroOrOneStepLastsTwo) {
  for (const int64_t warmup : {0, 1}) {
    SCOPED_TRACE(warmup);
    const LrSchedule linear(WarmupLR(WarmupType::kLinear, 0.0f, 0.01f, warmup), kTwoGroups);
    EXPECT_TRUE(LrNear(linear.Lr(0, 0), 0.0));
    EXPECT_TRUE(LrNear(linear.Lr(1, 0), 0.005));  // 0.01 * 1/2
    EXPECT_TRUE(LrNear(linear.Lr(2, 0), 0.01));
    const LrSchedule log(WarmupLR(WarmupType::kLog, 0.0f, 0.01f, warmup), kTwoGroups);
    EXPECT_TRUE(LrNear(log.Lr(1, 0), 0.01));  // ln(2) / ln(2)

    const LrSchedule decay(WarmupDecayLR(WarmupType::kLinear, 0.0f, 0.01f, warmup, 5), kTwoGroups);
    EXPECT_TRUE(LrNear(decay.Lr(1, 0), 0.005));                 // 0.01 * 1/2
    EXPECT_TRUE(LrNear(decay.Lr(2, 0), 0.01));                  // (5 - 2) / (5 - 2)
    EXPECT_TRUE(LrNear(decay.Lr(3, 0), 0.006666666666666667));  // 0.01 * (5 - 3) / 3
    EXPECT_TRUE(LrNear(decay.Lr(5, 0), 0.0));

    const LrSchedule cosine(WarmupCosineLR(WarmupType::kLinear, 0.0f, 0.0f, warmup, 5), kTwoGroups);
    EXPECT_TRUE(LrNear(cosine.Lr(1, 0), 0.005));   // 0.01 * 1/2
    EXPECT_TRUE(LrNear(cosine.Lr(2, 0), 0.0075));  // 0.01 * (1 + cos(pi/3)) / 2
    EXPECT_TRUE(LrNear(cosine.Lr(3, 0), 0.0025));  // 0.01 * (1 + cos(2pi/3)) / 2
    EXPECT_TRUE(LrNear(cosine.Lr(4, 0), 0.0));     // progress 3/3

    for (const WarmupType type : kWarmupTypes) {
      ExpectMatchesDeepSpeed(WarmupLR(type, 1e-4f, 1e-2f, warmup), kTwoGroups, 6);
      ExpectMatchesDeepSpeed(WarmupDecayLR(type, 1e-4f, 1e-2f, warmup, 7), kTwoGroups, 9);
      ExpectMatchesDeepSpeed(WarmupCosineLR(type, 0.1f, 0.02f, warmup, 7), kTwoGroups, 9);
    }
  }
}

// WarmupLR without warmup_max_lr warms every group up to its own lr (DeepSpeed's None).
TEST(LrScheduleTest, WarmupLrWithoutMaxWarmsEachGroupToItsOwnLr) {
  SchedulerConfig c;
  c.type = LrScheduleType::kWarmupLR;
  c.warmup_type = WarmupType::kLinear;
  c.warmup_num_steps = 4;
  const LrSchedule schedule(c, {0.1f, 0.02f});
  // it = 2: p = 2 / 4, so lr = 0 + 0.5 · group lr.
  EXPECT_FLOAT_EQ(schedule.Lr(2, 0), 0.05f);
  EXPECT_FLOAT_EQ(schedule.Lr(2, 1), 0.01f);
  // After warmup: each group's own lr.
  EXPECT_FLOAT_EQ(schedule.Lr(10, 0), 0.1f);
  EXPECT_FLOAT_EQ(schedule.Lr(10, 1), 0.02f);
}

}  // namespace
}  // namespace zero::runtime
