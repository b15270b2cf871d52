// Optimizer groups, hyperparameters changed between steps, per-param step counts and the
// learning-rate schedule, on in-process ranks, against a float64 reference written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/engine/reference_adamw.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/engine/scratch_dir.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::Not;
using testing::InitialValues;
using testing::IsOk;
using testing::MeanGradient;
using testing::RankGradient;
using testing::ReferenceAdamW;
using testing::RunOnRanks;
using testing::StatusIs;

// Two params of odd sizes: "w" in group 0, "b" in group 1.
constexpr int64_t kWeightNumel = 997, kBiasNumel = 61;

Config TwoGroupConfig(int stage) {
  Config c;
  c.stage = stage;
  c.optimizer.type = OptimizerType::kAdamW;
  c.optimizer.lr = 1e-2f;
  c.optimizer.weight_decay = 0.1f;
  ParamGroupOverrides no_decay;
  no_decay.lr = 5e-3f;
  no_decay.weight_decay = 0.0f;
  no_decay.beta2 = 0.99f;
  c.optimizer.param_groups = {ParamGroupOverrides{}, no_decay};
  c.buckets.reduce_bucket_elems = 300;  // params straddle shards and buckets
  c.buckets.first_bucket_elems = 300;
  c.buckets.last_bucket_elems = 0;
  c.stage3.persistence_threshold = 0;
  return c;
}

// An engine with "w" (group 0, unit 0) and "b" (group 1, unit 1) registered and set to their
// initial values; null after a failure reported to gtest.
std::unique_ptr<Engine> TwoParamEngine(const Config& config, comm::Communicator& comm) {
  auto created = Engine::Create(config, comm);
  EXPECT_THAT(created, IsOk());
  if (!created.ok()) return nullptr;
  Engine& engine = **created;
  const bool ok = engine.RegisterParam({"w", {kWeightNumel}, DType::kFP32, true, 0, 0}).ok() &&
                  engine.RegisterParam({"b", {kBiasNumel}, DType::kFP32, true, 1, 1}).ok() &&
                  engine.Finalize().ok() && engine.SetParam(0, InitialValues(0, kWeightNumel).data()).ok() &&
                  engine.SetParam(1, InitialValues(1, kBiasNumel).data()).ok();
  EXPECT_TRUE(ok) << "registering, finalizing or setting the two params failed";
  return ok ? std::move(*created) : nullptr;
}

// The lr each group gets before step `step` (1-based): changed every step, differently per group.
float LrBefore(int group, int step) { return (group == 0 ? 1e-2f : 5e-3f) * (1.0f - 0.15f * (step - 1)); }

class EngineGroups : public ::testing::TestWithParam<std::tuple<int, int>> {};

// Two groups with their own lr, weight decay and beta2; the lr of each changed between steps
// through SetGroupHyper: equal to float64 AdamW per group.
TEST_P(EngineGroups, TwoGroupsWithLrChangedBetweenStepsFollowTheReference) {
  const auto [stage, world] = GetParam();
  constexpr int kSteps = 5;
  const Config config = TwoGroupConfig(stage);
  std::vector<std::vector<float>> finals(world);
  RunOnRanks(world, [&](int r, comm::Communicator& comm) {
    std::unique_ptr<Engine> created = TwoParamEngine(config, comm);
    ASSERT_NE(created, nullptr);
    Engine& engine = *created;
    ASSERT_EQ(engine.num_groups(), 2);
    for (int step = 1; step <= kSteps; ++step) {
      for (int g = 0; g < 2; ++g) {
        auto hyper = engine.GroupHyper(g);
        ASSERT_THAT(hyper, IsOk());
        hyper->lr = LrBefore(g, step);
        ASSERT_THAT(engine.SetGroupHyper(g, *hyper), IsOk());
      }
      ASSERT_THAT(engine.BeginIteration(), IsOk());
      for (int param : {1, 0}) {  // backward order
        if (stage == 3) {
          ASSERT_THAT(engine.Gather(param), IsOk());
        }
        const int64_t numel = param == 0 ? kWeightNumel : kBiasNumel;
        ASSERT_THAT(engine.AccumulateGrad(param, RankGradient(param, numel, step, r).data()), IsOk());
        if (stage == 3) {
          ASSERT_THAT(engine.Release(param), IsOk());
        }
      }
      ASSERT_THAT(engine.EndBackward(), IsOk());
      ASSERT_THAT(engine.Step(), IsOk());
    }
    std::vector<float> w(kWeightNumel), b(kBiasNumel);
    ASSERT_THAT(engine.GetParam(0, w.data()), IsOk());
    ASSERT_THAT(engine.GetParam(1, b.data()), IsOk());
    w.insert(w.end(), b.begin(), b.end());
    finals[r] = w;
  });
  ReferenceAdamW w(InitialValues(0, kWeightNumel)), b(InitialValues(1, kBiasNumel));
  for (int step = 1; step <= kSteps; ++step) {
    OptimizerHyper h0 = config.optimizer.Group(0), h1 = config.optimizer.Group(1);
    h0.lr = LrBefore(0, step);
    h1.lr = LrBefore(1, step);
    w.Step(MeanGradient(0, kWeightNumel, step, world), h0);
    b.Step(MeanGradient(1, kBiasNumel, step, world), h1);
  }
  std::vector<double> expected = w.w;
  expected.insert(expected.end(), b.w.begin(), b.w.end());
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(finals[r].size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_NEAR(finals[r][i], expected[i], 1e-5) << "rank " << r << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(StagesAndWorlds, EngineGroups,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(2, 3)));

// One rank alone changes a group's setting (an lr scheduler stepped on rank 0 only): each rank
// would step its shard with its own value. Step refuses on every rank, naming the group and the
// setting, and changes nothing; once the ranks agree, the same Step goes on.
TEST_P(EngineGroups, SettingsThatDifferBetweenRanksAreRefusedAtStep) {
  const auto [stage, world] = GetParam();
  const Config config = TwoGroupConfig(stage);
  RunOnRanks(world, [&](int r, comm::Communicator& comm) {
    std::unique_ptr<Engine> created = TwoParamEngine(config, comm);
    ASSERT_NE(created, nullptr);
    Engine& engine = *created;
    auto hyper = engine.GroupHyper(1);
    ASSERT_THAT(hyper, IsOk());
    const OptimizerHyper agreed = *hyper;
    if (r == world - 1) hyper->weight_decay = 0.5f;
    ASSERT_THAT(engine.SetGroupHyper(1, *hyper), IsOk());
    ASSERT_THAT(engine.BeginIteration(), IsOk());
    for (int param : {1, 0}) {
      if (stage == 3) {
        ASSERT_THAT(engine.Gather(param), IsOk());
      }
      const int64_t numel = param == 0 ? kWeightNumel : kBiasNumel;
      ASSERT_THAT(engine.AccumulateGrad(param, RankGradient(param, numel, 1, r).data()), IsOk());
      if (stage == 3) {
        ASSERT_THAT(engine.Release(param), IsOk());
      }
    }
    ASSERT_THAT(engine.EndBackward(), IsOk());
    EXPECT_THAT(engine.Step(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                        ::testing::AllOf(::testing::HasSubstr("group 1's weight_decay is 0 on one "
                                                                              "rank and 0.5 on another"),
                                                         ::testing::HasSubstr("every rank"))));
    EXPECT_EQ(engine.steps_taken(), 0);
    std::vector<float> w(kWeightNumel);
    ASSERT_THAT(engine.GetParam(0, w.data()), IsOk());
    EXPECT_EQ(w, InitialValues(0, kWeightNumel)) << "nothing was stepped";
    ASSERT_THAT(engine.SetGroupHyper(1, agreed), IsOk());
    auto info = engine.Step();
    ASSERT_THAT(info, IsOk());
    EXPECT_EQ(info->step, 1);
  });
}

// A param that no rank used keeps its own step count (guard.on_unused = "zero"), so its first
// update is bias-corrected as step 1, as PyTorch's per-param state does. Declared absent early
// (GradAbsent, as zerort.torch does for params its forward did not reach) or never mentioned,
// it is left untouched alike.
class EngineGroupsSteps : public ::testing::TestWithParam<bool> {};

TEST_P(EngineGroupsSteps, AParamLeftUntouchedKeepsItsOwnStepCount) {
  const bool declared_absent = GetParam();
  Config config = TwoGroupConfig(2);
  config.guard.on_unused = UnusedPolicy::kZero;
  constexpr int kSteps = 5, kFirstUse = 3;
  std::vector<float> final_b(kBiasNumel);
  RunOnRanks(2, [&](int r, comm::Communicator& comm) {
    std::unique_ptr<Engine> created = TwoParamEngine(config, comm);
    ASSERT_NE(created, nullptr);
    Engine& engine = *created;
    for (int step = 1; step <= kSteps; ++step) {
      ASSERT_THAT(engine.BeginIteration(), IsOk());
      if (step >= kFirstUse) {
        ASSERT_THAT(engine.AccumulateGrad(1, RankGradient(1, kBiasNumel, step, r).data()), IsOk());
      } else if (declared_absent) {
        ASSERT_THAT(engine.GradAbsent(1), IsOk());
        EXPECT_THAT(engine.AccumulateGrad(1, RankGradient(1, kBiasNumel, step, r).data()), Not(IsOk()));
      }
      ASSERT_THAT(engine.AccumulateGrad(0, RankGradient(0, kWeightNumel, step, r).data()), IsOk());
      ASSERT_THAT(engine.EndBackward(), IsOk());
      ASSERT_THAT(engine.Step(), IsOk());
    }
    std::vector<float> b(kBiasNumel);
    ASSERT_THAT(engine.GetParam(1, b.data()), IsOk());
    if (r == 0) final_b = b;
  });
  ReferenceAdamW b(InitialValues(1, kBiasNumel));
  for (int step = kFirstUse; step <= kSteps; ++step) b.Step(MeanGradient(1, kBiasNumel, step, 2), config.optimizer.Group(1));
  for (int64_t i = 0; i < kBiasNumel; ++i) ASSERT_NEAR(final_b[i], b.w[i], 1e-6) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(UnusedOrDeclaredAbsent, EngineGroupsSteps, ::testing::Bool());

TEST(EngineGroupsCalls, GradAbsentNeedsOnUnusedZero) {
  RunOnRanks(1, [&](int, comm::Communicator& comm) {
    std::unique_ptr<Engine> engine = TwoParamEngine(TwoGroupConfig(2), comm);
    ASSERT_NE(engine, nullptr);
    ASSERT_THAT(engine->BeginIteration(), IsOk());
    EXPECT_THAT(engine->GradAbsent(1), StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("on_unused")));
  });
}

// DeepSpeed's WarmupDecayLR, linear warmup over 4 steps from 0 to 0.1, decaying to 0 at step
// 8. Plain SGD shows the lr each step applied: w moves by exactly -lr · g. A step skipped for
// an overflow does not advance the schedule.
TEST(EngineGroupsSchedule, EveryStepAppliesDeepSpeedsLrAndASkippedStepDoesNotAdvanceIt) {
  Config config;
  config.stage = 2;
  config.optimizer.type = OptimizerType::kSgd;
  config.optimizer.weight_decay = 0.0f;
  config.scheduler.type = LrScheduleType::kWarmupDecayLR;
  config.scheduler.warmup_type = WarmupType::kLinear;
  config.scheduler.warmup_min_lr = 0.0f;
  config.scheduler.warmup_max_lr = 0.1f;
  config.scheduler.warmup_num_steps = 4;
  config.scheduler.total_num_steps = 8;
  config.loss_scale.mode = LossScaleMode::kDynamic;
  config.loss_scale.initial_power = 0;
  // last_batch_iteration it → lr: it < 4: 0.1 · it / 4; then 0.1 · (8 - it) / (8 - 4).
  // Applied step n runs at it = n - 2 (the first at it = -1: warmup_min_lr).
  const std::vector<double> expected_lrs = {0.0, 0.0, 0.025, 0.05, 0.075, 0.1, 0.075, 0.05, 0.025, 0.0};
  RunOnRanks(2, [&](int r, comm::Communicator& comm) {
    auto created = Engine::Create(config, comm);
    ASSERT_THAT(created, IsOk());
    Engine& engine = **created;
    ASSERT_THAT(engine.RegisterParam({"w", {kBiasNumel}}), IsOk());
    ASSERT_THAT(engine.Finalize(), IsOk());
    std::vector<float> before(kBiasNumel, 1.0f), after(kBiasNumel), grad(kBiasNumel, 1.0f);
    ASSERT_THAT(engine.SetParam(0, before.data()), IsOk());
    size_t applied = 0;
    for (int iteration = 0; applied < expected_lrs.size(); ++iteration) {
      const bool overflow = iteration == 3;  // one skipped step in the middle of warmup
      std::vector<float> g = grad;
      if (overflow && r == 1) g[5] = INFINITY;
      ASSERT_THAT(engine.BeginIteration(), IsOk());
      ASSERT_THAT(engine.AccumulateGrad(0, g.data()), IsOk());
      ASSERT_THAT(engine.EndBackward(), IsOk());
      auto info = engine.Step();
      ASSERT_THAT(info, IsOk());
      ASSERT_EQ(info->skipped, overflow);
      ASSERT_THAT(engine.GetParam(0, after.data()), IsOk());
      if (!overflow) {
        const double lr = (before[0] - after[0]) / 1.0;  // the averaged gradient is 1
        EXPECT_NEAR(lr, expected_lrs[applied], 1e-6) << "applied step " << applied + 1;
        ++applied;
        EXPECT_EQ(engine.lr_schedule_iteration(), static_cast<int64_t>(applied) - 1);
      }
      before = after;
    }
  });
}

// A run saved mid-schedule on 2 ranks and resumed on 3 follows the uninterrupted run: the
// schedule's position, each group's hyperparameters and each param's step count come back.
TEST(EngineGroupsSchedule, ResumedAtAnotherWorldSizeFollowsTheUninterruptedRun) {
  Config config = TwoGroupConfig(2);
  config.scheduler.type = LrScheduleType::kWarmupCosineLR;
  config.scheduler.warmup_type = WarmupType::kLinear;
  config.scheduler.warmup_num_steps = 3;
  config.scheduler.total_num_steps = 8;
  config.guard.on_unused = UnusedPolicy::kZero;
  const std::string dir = testing::ScratchDir("groups_resume") + "/ckpt";
  constexpr int kSteps = 7, kSaveAfter = 3;
  // Runs steps [first, last) on `world` ranks, loading `load` first and saving after kSaveAfter.
  // Group 1's weight decay is changed by hand after step 2; "b" gets no gradient on step 2.
  auto run = [&](int world, int first, int last, bool load, bool save, std::vector<float>* out) {
    RunOnRanks(world, [&](int r, comm::Communicator& comm) {
      std::unique_ptr<Engine> created = TwoParamEngine(config, comm);
      ASSERT_NE(created, nullptr);
      Engine& engine = *created;
      if (load) {
        ASSERT_THAT(engine.LoadCheckpoint(dir), IsOk());
      }
      for (int step = first; step < last; ++step) {
        if (step == 2) {
          auto hyper = engine.GroupHyper(1);
          ASSERT_THAT(hyper, IsOk());
          hyper->weight_decay = 0.05f;
          ASSERT_THAT(engine.SetGroupHyper(1, *hyper), IsOk());
        }
        ASSERT_THAT(engine.BeginIteration(), IsOk());
        // Every rank contributes the 2-rank run's gradient for its share of the batch.
        if (step != 1) {
          ASSERT_THAT(engine.AccumulateGrad(1, RankGradient(1, kBiasNumel, step, 0).data()), IsOk());
        }
        ASSERT_THAT(engine.AccumulateGrad(0, RankGradient(0, kWeightNumel, step, 0).data()), IsOk());
        ASSERT_THAT(engine.EndBackward(), IsOk());
        ASSERT_THAT(engine.Step(), IsOk());
        if (save && step + 1 == kSaveAfter) {
          ASSERT_THAT(engine.SaveCheckpoint(dir), IsOk());
        }
      }
      std::vector<float> w(kWeightNumel), b(kBiasNumel);
      ASSERT_THAT(engine.GetParam(0, w.data()), IsOk());
      ASSERT_THAT(engine.GetParam(1, b.data()), IsOk());
      if (r == 0) {
        *out = w;
        out->insert(out->end(), b.begin(), b.end());
        for (int g = 0; g < 2; ++g) out->push_back(engine.GroupHyper(g)->lr);
        out->push_back(engine.GroupHyper(1)->weight_decay);
      }
    });
  };
  std::vector<float> uninterrupted, resumed, unused;
  run(2, 0, kSteps, /*load=*/false, /*save=*/true, &uninterrupted);
  run(3, kSaveAfter, kSteps, /*load=*/true, /*save=*/false, &resumed);
  ASSERT_EQ(resumed.size(), uninterrupted.size());
  for (size_t i = 0; i < resumed.size(); ++i) ASSERT_NEAR(resumed[i], uninterrupted[i], 1e-6) << "value " << i;
  EXPECT_FLOAT_EQ(resumed.back(), 0.05f);  // group 1's weight decay came back
}

// The same number of groups with other members (the no-decay group listed first this time):
// the saved hyperparameters would go to other params, so the load is refused naming one.
TEST(EngineGroupsSchedule, ACheckpointLoadedWithOtherGroupMembersIsRefused) {
  const Config config = TwoGroupConfig(1);
  const std::string dir = testing::ScratchDir("groups_members") + "/ckpt";
  RunOnRanks(2, [&](int, comm::Communicator& comm) {
    std::unique_ptr<Engine> saved = TwoParamEngine(config, comm);
    ASSERT_NE(saved, nullptr);
    ASSERT_THAT(saved->SaveCheckpoint(dir), IsOk());
    auto swapped = Engine::Create(config, comm);
    ASSERT_THAT(swapped, IsOk());
    ASSERT_THAT((*swapped)->RegisterParam({"w", {kWeightNumel}, DType::kFP32, true, 1, 0}), IsOk());
    ASSERT_THAT((*swapped)->RegisterParam({"b", {kBiasNumel}, DType::kFP32, true, 0, 1}), IsOk());
    ASSERT_THAT((*swapped)->Finalize(), IsOk());
    EXPECT_THAT((*swapped)->LoadCheckpoint(dir),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(::testing::HasSubstr("\"w\" was in optimizer group 0"),
                                          ::testing::HasSubstr("registered in group 1"))));
    std::unique_ptr<Engine> same = TwoParamEngine(config, comm);
    ASSERT_NE(same, nullptr);
    EXPECT_THAT(same->LoadCheckpoint(dir), IsOk());
  });
}

TEST(EngineGroupsCalls, BadGroupsAndValuesAreRefusedNamingThem) {
  RunOnRanks(1, [&](int, comm::Communicator& comm) {
    auto created = Engine::Create(TwoGroupConfig(2), comm);
    ASSERT_THAT(created, IsOk());
    Engine& engine = **created;
    ASSERT_THAT(engine.RegisterParam({"w", {kWeightNumel}}), IsOk());
    EXPECT_THAT(engine.GroupHyper(0), StatusIs(absl::StatusCode::kFailedPrecondition));
    ASSERT_THAT(engine.Finalize(), IsOk());
    EXPECT_EQ(engine.num_groups(), 2);  // the config's param_groups, though only group 0 is used
    EXPECT_THAT(engine.GroupHyper(2), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("group 2")));
    OptimizerHyper bad = *engine.GroupHyper(1);
    bad.lr = -1.0f;
    EXPECT_THAT(engine.SetGroupHyper(1, bad), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("lr")));
    EXPECT_FLOAT_EQ(engine.GroupHyper(1)->lr, 5e-3f);  // unchanged
  });
  RunOnRanks(1, [&](int, comm::Communicator& comm) {
    auto created = Engine::Create(TwoGroupConfig(2), comm);
    ASSERT_THAT(created, IsOk());
    EXPECT_THAT((*created)->RegisterParam({"w", {8}, DType::kFP32, true, kMaxOptimizerGroups}),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("\"w\": group 65536")));
  });
}

// DeepSpeed's batch arithmetic: train_batch_size = micro-batch × accumulation × world, checked
// when the engine knows the world size (without overflow for huge values); without the
// micro-batch size it must divide evenly.
TEST(EngineGroupsCalls, BatchSizesAreCheckedAgainstTheWorldSize) {
  RunOnRanks(3, [&](int, comm::Communicator& comm) {
    Config config;
    config.gradient_accumulation_steps = 4;
    config.batch.train_batch_size = 24;
    EXPECT_THAT(Engine::Create(config, comm), IsOk());  // 24 = 2 × 4 × 3
    config.batch.micro_batch_size_per_rank = 2;
    EXPECT_THAT(Engine::Create(config, comm), IsOk());
    config.batch.micro_batch_size_per_rank = 3;
    EXPECT_THAT(Engine::Create(config, comm),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("train_batch_size 24")));
    config.batch = {32, 0};
    EXPECT_THAT(Engine::Create(config, comm),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("not a multiple")));
    config.batch = {1, 1'000'000'000'000'000};
    config.gradient_accumulation_steps = 100000;
    EXPECT_THAT(Engine::Create(config, comm), StatusIs(absl::StatusCode::kInvalidArgument));
  });
}

}  // namespace
}  // namespace zero
