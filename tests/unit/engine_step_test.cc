// Step on in-process ranks: an overflow on one rank skips the step everywhere and halves the
// loss scale; clipping bounds the norm; a gradient's placement, when given, is taken as said.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::IsOk;
using testing::RunOnRanks;
using testing::ToyConfig;

// One micro-batch handing `grad` over for param `id`, then Step.
StatusOr<StepInfo> StepWithGradient(Engine& engine, ParamId id, const std::vector<float>& grad) {
  ZERO_RETURN_IF_ERROR(engine.BeginIteration());
  ZERO_RETURN_IF_ERROR(engine.AccumulateGrad(id, grad.data()));
  ZERO_RETURN_IF_ERROR(engine.EndBackward());
  return engine.Step();
}

TEST(EngineStep, LossScalingSkipsOverflowAndClippingBoundsTheNorm) {
  RunOnRanks(2, [&](int r, comm::Communicator& comm) {
      Config config = ToyConfig(2);
      config.loss_scale.mode = LossScaleMode::kDynamic;
      config.loss_scale.initial_power = 4;
      config.loss_scale.hysteresis = 1;
      config.clip_grad_norm = 0.5f;
      auto engine = Engine::Create(config, comm);
      ASSERT_THAT(engine, IsOk());
      const ParamId id = *(*engine)->RegisterParam({"w", {1000}});
      ASSERT_THAT((*engine)->Finalize(), IsOk());
      std::vector<float> init(1000, 1.0f), after(1000);
      ASSERT_THAT((*engine)->SetParam(id, init.data()), IsOk());
      // Step 1: rank 1 has an Inf → skipped everywhere, scale halves, params untouched.
      std::vector<float> grad(1000, 16.0f);  // 16 × scale 16 … unscaled 1.0 per element
      if (r == 1) grad[999] = INFINITY;
      auto info = StepWithGradient(**engine, id, grad);
      ASSERT_THAT(info, IsOk());
      EXPECT_TRUE(info->skipped);
      EXPECT_EQ(info->loss_scale, 8.0f);
      ASSERT_THAT((*engine)->GetParam(id, after.data()), IsOk());
      EXPECT_EQ(after, init);
      // Step 2: finite. Unscaled averaged gradient = 1 everywhere: norm sqrt(1000) ≈ 31.6 > 0.5.
      std::fill(grad.begin(), grad.end(), 8.0f);
      info = StepWithGradient(**engine, id, grad);
      ASSERT_THAT(info, IsOk());
      EXPECT_FALSE(info->skipped);
      EXPECT_EQ(info->step, 1);
      EXPECT_NEAR(info->grad_norm, std::sqrt(1000.0f), 1e-3);
      ASSERT_THAT((*engine)->GetParam(id, after.data()), IsOk());
      EXPECT_NE(after, init);
  });
}

// A stage-2 engine with dynamic loss scaling from 2^`initial_power`, never below `min`, and
// one param "w" of 100 ones.
StatusOr<std::unique_ptr<Engine>> DynamicScaleEngine(comm::Communicator& comm, int initial_power, float min,
                                                     int hysteresis) {
  Config config = ToyConfig(2);
  config.loss_scale.mode = LossScaleMode::kDynamic;
  config.loss_scale.initial_power = initial_power;
  config.loss_scale.min = min;
  config.loss_scale.hysteresis = hysteresis;
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
  ZERO_ASSIGN_OR_RETURN(const ParamId id, engine->RegisterParam({"w", {100}}));
  ZERO_RETURN_IF_ERROR(engine->Finalize());
  const std::vector<float> ones(100, 1.0f);
  ZERO_RETURN_IF_ERROR(engine->SetParam(id, ones.data()));
  return engine;
}

// As DeepSpeed's DynamicLossScaler: an overflow that finds the scale already at its minimum
// (with hysteresis spent) ends the run with an error; the step is skipped as before, so a
// trainer that catches it may go on, and a finite step after it steps.
TEST(EngineStep, AnOverflowAtTheMinimumLossScaleIsAnError) {
  for (const int hysteresis : {1, 2}) {
    RunOnRanks(3, [&](int r, comm::Communicator& comm) {
      auto engine = DynamicScaleEngine(comm, /*initial_power=*/2, /*min=*/2.0f, hysteresis);
      ASSERT_THAT(engine, IsOk());
      const ParamId id = 0;
      std::vector<float> init(100, 1.0f), after(100);
      auto step = [&](bool overflow) {
        std::vector<float> grad(100, 1.0f);
        if (overflow && r == 2) grad[7] = INFINITY;
        return StepWithGradient(**engine, id, grad);
      };
      // Scale 4: the overflows halve it to 2 (the minimum) after `hysteresis` of them; the
      // next overflow finds it there.
      for (int k = 0; k < hysteresis; ++k) {
        auto info = step(true);
        ASSERT_THAT(info, IsOk());
        EXPECT_TRUE(info->skipped);
      }
      for (int k = 0; k < 2; ++k) {
        auto ended = step(true);
        EXPECT_THAT(ended, testing::StatusIs(absl::StatusCode::kAborted));
        EXPECT_NE(ended.status().message().find("loss scale already at its minimum"), std::string::npos)
            << ended.status().message();
      }
      ASSERT_THAT((*engine)->GetParam(id, after.data()), IsOk());
      EXPECT_EQ(after, init) << "every overflowing step was skipped";
      auto info = step(false);
      ASSERT_THAT(info, IsOk());
      EXPECT_FALSE(info->skipped);
      EXPECT_EQ(info->step, 1);
    });
  }
  // A scale that starts below the minimum is raised to it by an overflow, as DeepSpeed's.
  RunOnRanks(2, [&](int r, comm::Communicator& comm) {
    auto engine = DynamicScaleEngine(comm, /*initial_power=*/0, /*min=*/4.0f, /*hysteresis=*/1);
    ASSERT_THAT(engine, IsOk());
    const ParamId id = 0;
    std::vector<float> grad(100, 1.0f);
    if (r == 1) grad[3] = INFINITY;
    auto info = StepWithGradient(**engine, id, grad);
    ASSERT_THAT(info, IsOk());
    EXPECT_TRUE(info->skipped);
    EXPECT_EQ(info->loss_scale, 4.0f);
  });
}

// DropGradients: a micro-batch the trainer rejects after its backward (or, with accumulation,
// a whole window) leaves no trace; the step that follows equals one that never saw it.
TEST(EngineStep, DroppedGradientsLeaveNoTraceInTheNextStep) {
  for (const int stage : {0, 1, 2, 3}) {
    for (const int accumulation : {1, 2}) {
      std::vector<std::vector<float>> kept(3), dropped(3);  // per rank: each thread writes its own
      std::vector<int64_t> steps(3);
      RunOnRanks(3, [&](int r, comm::Communicator& comm) {
        Config config = ToyConfig(stage);
        config.gradient_accumulation_steps = accumulation;
        for (const bool drop : {false, true}) {
          auto engine = Engine::Create(config, comm);
          ASSERT_THAT(engine, IsOk());
          const ParamId id = *(*engine)->RegisterParam({"w", {1001}});
          ASSERT_THAT((*engine)->Finalize(), IsOk());
          std::vector<float> values(1001), junk(1001, 1e3f);
          for (int i = 0; i < 1001; ++i) values[i] = 0.01f * static_cast<float>((i * 7) % 13);
          ASSERT_THAT((*engine)->SetParam(id, values.data()), IsOk());
          EXPECT_THAT((*engine)->DropGradients(), IsOk());  // nothing to drop yet
          auto micro_batch = [&](const std::vector<float>& grad) {
            ASSERT_THAT((*engine)->BeginIteration(), IsOk());
            ASSERT_THAT((*engine)->AccumulateGrad(id, grad.data()), IsOk());
            if (drop && r == 0) {  // inside a micro-batch: refused, nothing changes
              EXPECT_THAT((*engine)->DropGradients(),
                          testing::StatusIs(absl::StatusCode::kFailedPrecondition));
            }
            ASSERT_THAT((*engine)->EndBackward(), IsOk());
          };
          if (drop) {  // a rejected window (all of its micro-batches, or the first only)
            for (int m = 0; m < accumulation; ++m) micro_batch(junk);
            ASSERT_THAT((*engine)->DropGradients(), IsOk());
            micro_batch(junk);
            ASSERT_THAT((*engine)->DropGradients(), IsOk());
          }
          std::vector<float> grad(1001);
          for (int i = 0; i < 1001; ++i) grad[i] = 0.1f * static_cast<float>((i + 3 * r) % 5) - 0.2f;
          for (int m = 0; m < accumulation; ++m) micro_batch(grad);
          auto info = (*engine)->Step();
          ASSERT_THAT(info, IsOk());
          if (drop) steps[r] = info->step;
          std::vector<float>& out = (drop ? dropped : kept)[r];
          out.resize(1001);
          ASSERT_THAT((*engine)->GetParam(id, out.data()), IsOk());
        }
      });
      EXPECT_EQ(dropped, kept) << "stage " << stage << ", accumulation " << accumulation;
      EXPECT_EQ(steps, (std::vector<int64_t>{1, 1, 1})) << "stage " << stage;
    }
  }
}

// DropGradients is the trainer's call on every rank. One rank dropping a micro-batch alone
// reduces a later micro-batch than its peers at stages 0-1 (one reduction per window):
// guard.consistency_check names the divergence before the collective, on every rank.
TEST(EngineStep, ADropOnOneRankAloneIsNamedByTheConsistencyCheck) {
  for (const int stage : {0, 1}) {
    std::vector<Status> first_error(2);
    RunOnRanks(2, [&](int r, comm::Communicator& comm) {
      Config config = ToyConfig(stage);
      config.gradient_accumulation_steps = 2;
      config.guard.consistency_check = true;
      config.guard.timeout_s = 30;
      auto engine = Engine::Create(config, comm);
      ASSERT_THAT(engine, IsOk());
      const ParamId id = *(*engine)->RegisterParam({"w", {64}});
      ASSERT_THAT((*engine)->Finalize(), IsOk());
      const std::vector<float> grad(64, 0.25f);
      Status& status = first_error[r];
      auto micro_batch = [&] {  // up to its first error
        if (status.ok()) status = (*engine)->BeginIteration();
        if (status.ok()) status = (*engine)->AccumulateGrad(id, grad.data());
        if (status.ok()) status = (*engine)->EndBackward();
      };
      micro_batch();
      if (r == 0 && status.ok()) status = (*engine)->DropGradients();
      micro_batch();
      if (r == 0) micro_batch();
    });
    for (const Status& status : first_error) {
      EXPECT_THAT(status, testing::StatusIs(absl::StatusCode::kFailedPrecondition,
                                            ::testing::HasSubstr("ranks diverged")))
          << "stage " << stage;
    }
  }
}

// A caller that says where its gradient lives skips the pointer query; a device gradient for a
// CPU engine is refused and nothing arrives, so the same param can still be handed over.
TEST(EngineStep, AGradientWhosePlacementIsGivenIsTakenAsSaid) {
  auto group = comm::CreateLocalGroup(1);
  ASSERT_THAT(group, IsOk());
  auto engine = Engine::Create(ToyConfig(2), *(*group)[0]);
  ASSERT_THAT(engine, IsOk());
  const ParamId id = *(*engine)->RegisterParam({"w", {10}});
  ASSERT_THAT((*engine)->Finalize(), IsOk());
  std::vector<float> init(10, 1.0f), grad(10, 2.0f), after(10);
  ASSERT_THAT((*engine)->SetParam(id, init.data()), IsOk());
  ASSERT_THAT((*engine)->BeginIteration(), IsOk());
  const Status refused = (*engine)->AccumulateGrad(id, grad.data(), Placement::kDevice);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("device gradient for param 0"), std::string::npos) << refused;
  ASSERT_THAT((*engine)->AccumulateGrad(id, grad.data(), Placement::kHost), IsOk());
  ASSERT_THAT((*engine)->EndBackward(), IsOk());
  auto info = (*engine)->Step();
  ASSERT_THAT(info, IsOk());
  EXPECT_NEAR(info->grad_norm, std::sqrt(40.0f), 1e-5);
  ASSERT_THAT((*engine)->GetParam(id, after.data()), IsOk());
  EXPECT_NE(after, init);
}

}  // namespace
}  // namespace zero
