// GetFullState: a param's full fp32 master weights, AdamW moments and reduced gradient on
// every rank, at every stage and world size, against a float64 AdamW written here; SetFullState
// of the weights and moments between steps, read back exactly and trained on as the float64
// AdamW given the same values; and the calls each refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "tests/engine/accumulation_window.h"
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

// Two params of odd sizes that straddle buckets and shards.
constexpr int64_t kNumel[] = {997, 61};
constexpr int kSteps = 3, kMicroBatches = 2;
constexpr float kLossScale = 64.0f;  // a static scale: the gradients arrive multiplied by it

Config FullStateConfig(int stage) { return testing::AccumulatingAdamWConfig(stage, kMicroBatches, 6, 300); }

// The step's gradient as the optimizer applies it: the micro-batches summed, averaged over ranks.
std::vector<double> StepGradient(int param, int step, int world) {
  return testing::WindowGradient(param, kNumel[param], step, kMicroBatches, world);
}

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tolerance, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance * (1.0 + std::fabs(want[i]))) << what << " element " << i;
  }
}

class EngineFullState : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(EngineFullState, EveryRankReadsTheWholeParamsMomentsAndGradient) {
  const auto [stage, world] = GetParam();
  const Config config = FullStateConfig(stage);
  std::vector<ReferenceAdamW> reference;
  for (int p = 0; p < 2; ++p) reference.emplace_back(InitialValues(p, kNumel[p]));
  std::vector<std::vector<double>> step_grads(kSteps * 2);
  for (int step = 1; step <= kSteps; ++step) {
    for (int p = 0; p < 2; ++p) step_grads[(step - 1) * 2 + p] = StepGradient(p, step, world);
  }
  // Each rank's reads after each step (weights, moments) and before it (gradient).
  RunOnRanks(world, [&](int r, comm::Communicator& comm) {
    auto created = Engine::Create(config, comm);
    ASSERT_THAT(created, IsOk());
    Engine& engine = **created;
    ASSERT_THAT(testing::RegisterTwoParams(engine, kNumel), IsOk());
    std::vector<ReferenceAdamW> mine = reference;
    for (int step = 1; step <= kSteps; ++step) {
      ASSERT_THAT(testing::RunWindow(engine, kNumel, stage, step, r, kMicroBatches, kLossScale), IsOk());
      for (int p = 0; p < 2; ++p) {
        std::vector<float> got(kNumel[p], std::nanf(""));  // poisoned
        ASSERT_THAT(engine.GetFullState(p, ParamState::kGrad, got.data()), IsOk());
        ExpectNear(got, step_grads[(step - 1) * 2 + p], 1e-6, "gradient");
      }
      ASSERT_THAT(engine.Step(), IsOk());
      for (int p = 0; p < 2; ++p) {
        mine[p].Step(step_grads[(step - 1) * 2 + p], config.optimizer.Group(0));
        const std::pair<ParamState, const std::vector<double>*> reads[] = {
            {ParamState::kWeights, &mine[p].w}, {ParamState::kFirstMoment, &mine[p].m},
            {ParamState::kSecondMoment, &mine[p].v}};
        for (const auto& [state, want] : reads) {
          std::vector<float> got(kNumel[p], std::nanf(""));
          ASSERT_THAT(engine.GetFullState(p, state, got.data()), IsOk());
          ExpectNear(got, *want, 1e-5, "weights or moment");
        }
      }
    }
    std::vector<float> out(kNumel[0]);
    EXPECT_THAT(engine.GetFullState(0, ParamState::kGrad, out.data()), StatusIs(absl::StatusCode::kFailedPrecondition))
        << "after Step there is no gradient";
  });
}

INSTANTIATE_TEST_SUITE_P(StagesAndWorlds, EngineFullState,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2, 3)));

// Fresh values (never zeros) for SetFullState of param 0: weights, first and second moment.
std::vector<float> SetValues(int which) {
  std::vector<float> values(kNumel[0]);
  for (int64_t i = 0; i < kNumel[0]; ++i) {
    const float wave = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(which));
    values[i] = which == 2 ? 0.01f * (1.5f + wave) : (which == 1 ? 0.1f : 1.0f) * wave;
  }
  return values;
}

TEST_P(EngineFullState, SetWeightsAndMomentsAreReadBackAndTrainedOn) {
  const auto [stage, world] = GetParam();
  const Config config = FullStateConfig(stage);
  const std::vector<float> weights = SetValues(0), first = SetValues(1), second = SetValues(2);
  RunOnRanks(world, [&](int r, comm::Communicator& comm) {
    auto created = Engine::Create(config, comm);
    ASSERT_THAT(created, IsOk());
    Engine& engine = **created;
    ASSERT_THAT(testing::RegisterTwoParams(engine, kNumel), IsOk());
    std::vector<ReferenceAdamW> mine;
    for (int p = 0; p < 2; ++p) mine.emplace_back(InitialValues(p, kNumel[p]));
    for (int step = 1; step <= kSteps; ++step) {
      ASSERT_THAT(testing::RunWindow(engine, kNumel, stage, step, r, kMicroBatches, kLossScale), IsOk());
      ASSERT_THAT(engine.Step(), IsOk());
      for (int p = 0; p < 2; ++p) mine[p].Step(StepGradient(p, step, world), config.optimizer.Group(0));
      if (step != 1) continue;
      ASSERT_THAT(engine.SetFullState(0, ParamState::kWeights, weights.data()), IsOk());
      ASSERT_THAT(engine.SetFullState(0, ParamState::kFirstMoment, first.data()), IsOk());
      ASSERT_THAT(engine.SetFullState(0, ParamState::kSecondMoment, second.data()), IsOk());
      mine[0].w.assign(weights.begin(), weights.end());
      mine[0].m.assign(first.begin(), first.end());
      mine[0].v.assign(second.begin(), second.end());
      const std::pair<ParamState, const std::vector<float>*> reads[] = {
          {ParamState::kWeights, &weights}, {ParamState::kFirstMoment, &first}, {ParamState::kSecondMoment, &second}};
      for (const auto& [state, want] : reads) {
        std::vector<float> got(kNumel[0], std::nanf(""));
        ASSERT_THAT(engine.GetFullState(0, state, got.data()), IsOk());
        EXPECT_EQ(got, *want) << "read back";
      }
      std::vector<float> param(kNumel[0], std::nanf(""));
      if (stage == 3) {
        ASSERT_THAT(engine.Gather(0), IsOk());
      }
      ASSERT_THAT(engine.GetParam(0, param.data()), IsOk());
      if (stage == 3) {
        ASSERT_THAT(engine.Release(0), IsOk());
      }
      EXPECT_EQ(param, weights) << "the param itself";
    }
    for (int p = 0; p < 2; ++p) {
      std::vector<float> got(kNumel[p], std::nanf(""));
      ASSERT_THAT(engine.GetFullState(p, ParamState::kWeights, got.data()), IsOk());
      ExpectNear(got, mine[p].w, 1e-5, "weights trained after the set");
    }
  });
}

// Every rank passes the same values and keeps its part: ranks passing different ones are
// refused on every rank (each would keep a part of another value) and nothing changes.
TEST(EngineFullStateRefusals, RanksPassingDifferentValuesChangeNothing) {
  const Config config = FullStateConfig(2);
  RunOnRanks(2, [&](int r, comm::Communicator& comm) {
    auto created = Engine::Create(config, comm);
    ASSERT_THAT(created, IsOk());
    Engine& engine = **created;
    ASSERT_THAT(testing::RegisterTwoParams(engine, kNumel), IsOk());
    ASSERT_THAT(testing::RunWindow(engine, kNumel, 2, 1, r, kMicroBatches, kLossScale), IsOk());
    ASSERT_THAT(engine.Step(), IsOk());
    std::vector<float> before(kNumel[0]), after(kNumel[0]);
    ASSERT_THAT(engine.GetFullState(0, ParamState::kFirstMoment, before.data()), IsOk());
    std::vector<float> values = SetValues(1);
    values[kNumel[0] - 1] += static_cast<float>(r);  // rank 1's last element differs
    EXPECT_THAT(engine.SetFullState(0, ParamState::kFirstMoment, values.data()),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(::testing::HasSubstr("the ranks pass different values"),
                                          ::testing::HasSubstr(r == 0 ? "rank(s) 1" : "rank(s) 0"))));
    ASSERT_THAT(engine.GetFullState(0, ParamState::kFirstMoment, after.data()), IsOk());
    EXPECT_EQ(after, before) << "nothing changed";
  });
}

// SGD with momentum (one moment buffer), one micro-batch per step.
Config SgdConfig(int stage) {
  Config config = FullStateConfig(stage);
  config.optimizer.type = OptimizerType::kSgd;
  config.optimizer.momentum = 0.9f;
  config.gradient_accumulation_steps = 1;
  return config;
}

TEST(EngineFullStateRefusals, NamesWhatCannotBeSet) {
  const Config config = SgdConfig(2);
  auto group = comm::CreateLocalGroup(1);
  ASSERT_THAT(group, IsOk());
  auto created = Engine::Create(config, *(*group)[0]);
  ASSERT_THAT(created, IsOk());
  Engine& engine = **created;
  const std::vector<float> values = SetValues(0);
  ASSERT_THAT(engine.RegisterParam({"w", {kNumel[0]}, DType::kFP32, true, 0, 0}), IsOk());
  ASSERT_THAT(engine.RegisterParam({"frozen", {kNumel[0]}, DType::kFP32, false, 0, 1}), IsOk());
  EXPECT_THAT(engine.SetFullState(0, ParamState::kWeights, values.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(engine.Finalize(), IsOk());
  EXPECT_THAT(engine.SetFullState(0, ParamState::kFirstMoment, values.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("first optimizer step")))
      << "SGD's first step would start the buffer from the gradient, dropping the value";
  ASSERT_THAT(engine.BeginIteration(), IsOk());
  ASSERT_THAT(engine.AccumulateGrad(0, values.data()), IsOk());
  ASSERT_THAT(engine.EndBackward(), IsOk());
  ASSERT_THAT(engine.Step(), IsOk());
  EXPECT_THAT(engine.SetFullState(0, ParamState::kFirstMoment, values.data()), IsOk());
  std::vector<float> read(kNumel[0], std::nanf(""));
  ASSERT_THAT(engine.GetFullState(0, ParamState::kFirstMoment, read.data()), IsOk());
  EXPECT_EQ(read, values);
  EXPECT_THAT(engine.SetFullState(0, ParamState::kSecondMoment, values.data()),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(engine.SetFullState(0, ParamState::kGrad, values.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("comes from backward")));
  EXPECT_THAT(engine.SetFullState(1, ParamState::kWeights, values.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("frozen")));
  EXPECT_THAT(engine.SetFullState(0, ParamState::kWeights, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  for (int state : {-1, 4, 9}) {
    EXPECT_THAT(engine.SetFullState(0, static_cast<ParamState>(state), values.data()),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("not a ParamState")));
    EXPECT_THAT(engine.GetFullState(0, static_cast<ParamState>(state), read.data()),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("not a ParamState")));
  }
  ASSERT_THAT(engine.GetFullState(0, ParamState::kWeights, read.data()), IsOk());
  EXPECT_NE(read, values) << "the refused sets left the weights as the step made them";
  ASSERT_THAT(engine.BeginIteration(), IsOk());
  EXPECT_THAT(engine.SetFullState(0, ParamState::kWeights, values.data()),
              StatusIs(absl::StatusCode::kFailedPrecondition))
      << "inside a micro-batch";
}

TEST(EngineFullStateRefusals, NamesWhatCannotBeRead) {
  for (int stage : {0, 3}) {
    const Config config = SgdConfig(stage);
    auto group = comm::CreateLocalGroup(1);
    ASSERT_THAT(group, IsOk());
    auto created = Engine::Create(config, *(*group)[0]);
    ASSERT_THAT(created, IsOk());
    Engine& engine = **created;
    std::vector<float> out(kNumel[0]);
    ASSERT_THAT(engine.RegisterParam({"w", {kNumel[0]}, DType::kFP32, true, 0, 0}), IsOk());
    ASSERT_THAT(engine.RegisterParam({"frozen", {kNumel[0]}, DType::kFP32, false, 0, 1}), IsOk());
    EXPECT_THAT(engine.GetFullState(0, ParamState::kWeights, out.data()), StatusIs(absl::StatusCode::kFailedPrecondition));
    ASSERT_THAT(engine.Finalize(), IsOk());
    EXPECT_THAT(engine.GetFullState(0, ParamState::kFirstMoment, out.data()), IsOk());
    EXPECT_THAT(engine.GetFullState(0, ParamState::kSecondMoment, out.data()), StatusIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(engine.GetFullState(1, ParamState::kWeights, out.data()), StatusIs(absl::StatusCode::kFailedPrecondition));
    EXPECT_THAT(engine.GetFullState(2, ParamState::kWeights, out.data()), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(engine.GetFullState(0, ParamState::kWeights, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(engine.GetFullState(0, ParamState::kGrad, out.data()), StatusIs(absl::StatusCode::kFailedPrecondition));
    ASSERT_THAT(engine.BeginIteration(), IsOk());
    EXPECT_THAT(engine.GetFullState(0, ParamState::kWeights, out.data()), StatusIs(absl::StatusCode::kFailedPrecondition))
        << "inside a micro-batch";
  }
}

}  // namespace
}  // namespace zero
