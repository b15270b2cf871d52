// Step on in-process ranks: an overflow on one rank skips the step everywhere and halves the
// loss scale; clipping bounds the norm; a gradient's placement, when given, is taken as said.
#include <gtest/gtest.h>

#include <cmath>

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
      ASSERT_THAT((*engine)->BeginIteration(), IsOk());
      ASSERT_THAT((*engine)->AccumulateGrad(id, grad.data()), IsOk());
      ASSERT_THAT((*engine)->EndBackward(), IsOk());
      auto info = (*engine)->Step();
      ASSERT_THAT(info, IsOk());
      EXPECT_TRUE(info->skipped);
      EXPECT_EQ(info->loss_scale, 8.0f);
      ASSERT_THAT((*engine)->GetParam(id, after.data()), IsOk());
      EXPECT_EQ(after, init);
      // Step 2: finite. Unscaled averaged gradient = 1 everywhere: norm sqrt(1000) ≈ 31.6 > 0.5.
      std::fill(grad.begin(), grad.end(), 8.0f);
      ASSERT_THAT((*engine)->BeginIteration(), IsOk());
      ASSERT_THAT((*engine)->AccumulateGrad(id, grad.data()), IsOk());
      ASSERT_THAT((*engine)->EndBackward(), IsOk());
      info = (*engine)->Step();
      ASSERT_THAT(info, IsOk());
      EXPECT_FALSE(info->skipped);
      EXPECT_EQ(info->step, 1);
      EXPECT_NEAR(info->grad_norm, std::sqrt(1000.0f), 1e-3);
      ASSERT_THAT((*engine)->GetParam(id, after.data()), IsOk());
      EXPECT_NE(after, init);
  });
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
