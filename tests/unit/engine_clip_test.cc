// ClipGradNorm (FSDP's clip_grad_norm_): the norm before the step, equal to a float64 norm
// of the averaged, unscaled gradient, and that one step clipped to its max_norm, against a
// float64 AdamW, at every stage and world size; later steps clip to the config's value again.
// And what it refuses: ranks passing different max_norms, a call before the window's last
// EndBackward, a max_norm that is not a finite number >= 0. The step after it takes its norm
// instead of summing the gradients again.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "runtime/engine_impl.h"
#include "tests/engine/accumulation_window.h"
#include "tests/engine/counting_communicator.h"
#include "tests/engine/deferred_device.h"
#include "tests/engine/reference_adamw.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::InitialValues;
using testing::IsOk;
using testing::RankGradient;
using testing::ReferenceAdamW;
using testing::RunOnRanks;
using testing::StatusIs;

constexpr int64_t kNumel[] = {733, 45};  // odd sizes that straddle buckets and shards
constexpr int kSteps = 4, kMicroBatches = 2;
constexpr float kLossScale = 16.0f;  // a static scale: the norm must divide it out

Config ClipConfig(int stage, float clip) {
  Config c = testing::AccumulatingAdamWConfig(stage, kMicroBatches, 4, 256);
  c.clip_grad_norm = clip;
  return c;
}

std::vector<float> MicroGradient(int param, int step, int micro, int rank) {
  return testing::MicroGradient(param, kNumel[param], step, micro, rank);
}

// Both params' gradients of `step` as the optimizer applies them.
std::vector<std::vector<double>> StepGradients(int step, int world) {
  return {testing::WindowGradient(0, kNumel[0], step, kMicroBatches, world),
          testing::WindowGradient(1, kNumel[1], step, kMicroBatches, world)};
}

double Norm(const std::vector<std::vector<double>>& grads) {
  double squares = 0.0;
  for (const auto& g : grads) {
    for (double x : g) squares += x * x;
  }
  return std::sqrt(squares);
}

void RunWindow(Engine& engine, int stage, int step, int rank) {
  ASSERT_THAT(testing::RunWindow(engine, kNumel, stage, step, rank, kMicroBatches, kLossScale), IsOk());
}

std::unique_ptr<Engine> MakeEngine(const Config& config, comm::Communicator& comm) {
  auto created = Engine::Create(config, comm);
  EXPECT_THAT(created, IsOk());
  if (!created.ok()) return nullptr;
  EXPECT_THAT(testing::RegisterTwoParams(**created, kNumel), IsOk());
  return std::move(*created);
}

class EngineClip : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(EngineClip, TheNormBeforeTheStepAndThatStepClippedToMaxNorm) {
  const auto [stage, world] = GetParam();
  std::vector<std::vector<std::vector<double>>> grads;
  std::vector<double> norms;
  for (int step = 1; step <= kSteps; ++step) {
    grads.push_back(StepGradients(step, world));
    norms.push_back(Norm(grads.back()));
  }
  // The config clips below every step's norm; ClipGradNorm overrides it for one step each:
  // step 1 clips harder, step 2 follows the config, step 3 does not clip, step 4 the config.
  const double smallest = *std::min_element(norms.begin(), norms.end());
  const float config_clip = static_cast<float>(0.6 * smallest);
  const float max_norms[kSteps] = {static_cast<float>(0.3 * smallest), -1.0f, 0.0f, -1.0f};  // -1: not called
  const Config config = ClipConfig(stage, config_clip);
  std::vector<ReferenceAdamW> reference;
  for (int p = 0; p < 2; ++p) reference.emplace_back(InitialValues(p, kNumel[p]));
  for (int step = 0; step < kSteps; ++step) {
    const float clip = max_norms[step] >= 0.0f ? max_norms[step] : config_clip;
    const double coefficient = clip > 0.0f && norms[step] > clip ? clip / (norms[step] + 1e-6) : 1.0;
    for (int p = 0; p < 2; ++p) {
      std::vector<double> g = grads[step][p];
      for (double& x : g) x *= coefficient;
      reference[p].Step(g, config.optimizer.Group(0));
    }
  }
  RunOnRanks(world, [&](int r, comm::Communicator& comm) {
    std::unique_ptr<Engine> engine = MakeEngine(config, comm);
    ASSERT_NE(engine, nullptr);
    for (int step = 0; step < kSteps; ++step) {
      RunWindow(*engine, stage, step + 1, r);
      if (max_norms[step] >= 0.0f) {
        auto norm = engine->ClipGradNorm(max_norms[step]);
        ASSERT_THAT(norm, IsOk());
        EXPECT_NEAR(*norm, norms[step], 1e-5 * norms[step]) << "step " << step + 1;
      }
      auto info = engine->Step();
      ASSERT_THAT(info, IsOk());
      EXPECT_NEAR(info->grad_norm, norms[step], 1e-5 * norms[step]) << "step " << step + 1;
    }
    for (int p = 0; p < 2; ++p) {
      std::vector<float> got(kNumel[p], std::nanf(""));  // poisoned
      ASSERT_THAT(engine->GetParam(p, got.data()), IsOk());
      for (int64_t i = 0; i < kNumel[p]; ++i) {
        ASSERT_NEAR(got[i], reference[p].w[i], 1e-5 * (1.0 + std::fabs(reference[p].w[i])))
            << "param " << p << " element " << i;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(StagesAndWorlds, EngineClip,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2, 3)));

// ClipGradNorm decides the norm and the gradient scale for the next Step, which takes them
// instead of summing the same gradients again: a step clipped through the call launches the
// max_norm's agreement and one sum of squares, one collective more than a step the config
// clips, and trains the same bits.
TEST(EngineClipThenStep, TheStepTakesTheNormInsteadOfSummingAgain) {
  constexpr int kWorld = 2;
  double smallest = std::numeric_limits<double>::infinity();
  for (int step = 1; step <= kSteps; ++step) smallest = std::min(smallest, Norm(StepGradients(step, kWorld)));
  const float clip = static_cast<float>(0.5 * smallest);
  for (int stage : {0, 2, 3}) {
    std::vector<float> trained[2];
    int collectives_in_steps[2] = {0, 0};
    for (const bool through_call : {false, true}) {
      RunOnRanks(kWorld, [&](int r, comm::Communicator& comm) {
        testing::CountingCommunicator counting(comm);
        std::unique_ptr<Engine> engine = MakeEngine(ClipConfig(stage, through_call ? 0.0f : clip), counting);
        ASSERT_NE(engine, nullptr);
        for (int step = 1; step <= kSteps; ++step) {
          RunWindow(*engine, stage, step, r);
          const int before = counting.collectives();
          if (through_call) {
            ASSERT_THAT(engine->ClipGradNorm(clip), IsOk());
          }
          ASSERT_THAT(engine->Step(), IsOk());
          if (r == 0) {
            collectives_in_steps[through_call] += counting.collectives() - before;
          }
        }
        std::vector<float> values(kNumel[0] + kNumel[1]);
        ASSERT_THAT(engine->GetParam(0, values.data()), IsOk());
        ASSERT_THAT(engine->GetParam(1, values.data() + kNumel[0]), IsOk());
        if (r == 0) trained[through_call] = values;
      });
    }
    EXPECT_EQ(collectives_in_steps[1], collectives_in_steps[0] + kSteps) << "stage " << stage;
    EXPECT_EQ(trained[0], trained[1]) << "stage " << stage;
  }
}

TEST(EngineClipRefusals, RanksThatPassDifferentMaxNormsAreRefusedAndMayRetry) {
  for (int stage : {0, 2, 3}) {
    RunOnRanks(3, [&](int r, comm::Communicator& comm) {
      std::unique_ptr<Engine> engine = MakeEngine(ClipConfig(stage, 0.0f), comm);
      ASSERT_NE(engine, nullptr);
      RunWindow(*engine, stage, 1, r);
      const auto refused = engine->ClipGradNorm(r == 1 ? 0.25f : 0.5f);
      EXPECT_THAT(refused, StatusIs(absl::StatusCode::kInvalidArgument));
      EXPECT_NE(refused.status().message().find("0.25 on one rank and 0.5 on another"), std::string::npos)
          << refused.status().message();
      ASSERT_THAT(engine->ClipGradNorm(0.5f), IsOk());
      ASSERT_THAT(engine->Step(), IsOk());
    });
  }
}

// A max_norm that one rank alone gets wrong is refused on every rank, which can then retry:
// no rank is left waiting in the norm's collective.
TEST(EngineClipRefusals, AnUnusableMaxNormOnOneRankIsRefusedOnEveryRank) {
  RunOnRanks(3, [&](int r, comm::Communicator& comm) {
    std::unique_ptr<Engine> engine = MakeEngine(ClipConfig(2, 0.0f), comm);
    ASSERT_NE(engine, nullptr);
    RunWindow(*engine, 2, 1, r);
    const auto refused = engine->ClipGradNorm(r == 2 ? -1.0f : 0.5f);
    EXPECT_THAT(refused, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(refused.status().message().find(r == 2 ? "on this rank" : "unusable on another rank"),
              std::string::npos) << refused.status().message();
    ASSERT_THAT(engine->ClipGradNorm(0.5f), IsOk());
    ASSERT_THAT(engine->Step(), IsOk());
  });
}

// A norm the last step left on the device (sync_grad_norm false, on a device model whose
// queued work runs when the host waits) is still that step's after ClipGradNorm has decided
// the next one in the same scalars.
TEST(EngineClipRefusals, TheLastStepsNormLeftOnTheDeviceIsKept) {
  Config config = ClipConfig(2, 0.0f);
  config.sync_grad_norm = false;
  config.loss_scale.mode = LossScaleMode::kNone;
  auto group = comm::CreateLocalGroup(1);
  ASSERT_THAT(group, IsOk());
  testing::DeferredDeviceOps* ops = nullptr;
  auto created = runtime::CreateEngine(config, *(*group)[0], testing::DeferredDeviceFactory(&ops));
  ASSERT_THAT(created, IsOk());
  Engine& engine = **created;
  ASSERT_THAT(testing::RegisterTwoParams(engine, kNumel), IsOk());
  auto window = [&](int step) {
    for (int micro = 0; micro < kMicroBatches; ++micro) {
      ASSERT_THAT(engine.BeginIteration(), IsOk());
      for (int p : {1, 0}) {
        const std::vector<float> g = MicroGradient(p, step, micro, 0);
        ASSERT_THAT(engine.AccumulateGrad(p, g.data()), IsOk());
        ASSERT_THAT(ops->RunTrainerWork(), IsOk());  // the copy of `g` runs before `g` goes
      }
      ASSERT_THAT(engine.EndBackward(), IsOk());
    }
  };
  window(1);
  auto info = engine.Step();
  ASSERT_THAT(info, IsOk());
  EXPECT_TRUE(std::isnan(info->grad_norm)) << "left on the device";
  window(2);
  auto next = engine.ClipGradNorm(0.0f);
  ASSERT_THAT(next, IsOk());
  const double second = Norm(StepGradients(2, 1));
  EXPECT_NEAR(*next, second, 1e-5 * second);
  auto last = engine.LastGradNorm();
  ASSERT_THAT(last, IsOk());
  const double first = Norm(StepGradients(1, 1));
  EXPECT_NEAR(*last, first, 1e-5 * first) << "the last step's norm, not the next one's (" << *next << ")";
}

TEST(EngineClipRefusals, OutsideTheWindowsEndOrWithABadMaxNorm) {
  auto group = comm::CreateLocalGroup(1);
  ASSERT_THAT(group, IsOk());
  std::unique_ptr<Engine> engine = MakeEngine(ClipConfig(2, 0.0f), *(*group)[0]);
  ASSERT_NE(engine, nullptr);
  EXPECT_THAT(engine->ClipGradNorm(1.0f), StatusIs(absl::StatusCode::kFailedPrecondition)) << "no gradient yet";
  ASSERT_THAT(engine->BeginIteration(), IsOk());
  EXPECT_THAT(engine->ClipGradNorm(1.0f), StatusIs(absl::StatusCode::kFailedPrecondition)) << "inside a micro-batch";
  for (int p = 0; p < 2; ++p) ASSERT_THAT(engine->AccumulateGrad(p, MicroGradient(p, 1, 0, 0).data()), IsOk());
  ASSERT_THAT(engine->EndBackward(), IsOk());
  EXPECT_THAT(engine->ClipGradNorm(1.0f), StatusIs(absl::StatusCode::kFailedPrecondition)) << "1 of 2 micro-batches";
  ASSERT_THAT(engine->BeginIteration(), IsOk());
  for (int p = 0; p < 2; ++p) ASSERT_THAT(engine->AccumulateGrad(p, MicroGradient(p, 1, 1, 0).data()), IsOk());
  ASSERT_THAT(engine->EndBackward(), IsOk());
  for (float bad : {-1.0f, std::nanf(""), -std::numeric_limits<float>::infinity()}) {
    EXPECT_THAT(engine->ClipGradNorm(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
  ASSERT_THAT(engine->ClipGradNorm(std::numeric_limits<float>::infinity()), IsOk()) << "+inf: no clipping";
  ASSERT_THAT(engine->ClipGradNorm(1.0f), IsOk());
  ASSERT_THAT(engine->Step(), IsOk());
  EXPECT_THAT(engine->ClipGradNorm(1.0f), StatusIs(absl::StatusCode::kFailedPrecondition)) << "after the step";
}

}  // namespace
}  // namespace zero
