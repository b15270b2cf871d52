// SGD whose momentum is turned on after the engine was built (torch's OneCycleLR and CyclicLR
// cycle it; a param group may have it while the optimizer's own is 0): the engine adds its
// momentum buffer then, and each param's first step with momentum starts the buffer from the
// gradient, as torch.optim.SGD creates it at that step. Against a float64 SGD at every stage on
// 2 ranks, through a checkpoint loaded into an engine built without momentum.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
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

using testing::InitialValues;
using testing::IsOk;
using testing::MeanGradient;
using testing::RankGradient;
using testing::RunOnRanks;

constexpr int64_t kNumel[2] = {997, 61};  // "w" in group 0, "b" in group 1
constexpr int kSteps = 6, kWorld = 2;
constexpr float kLr = 0.05f, kDampening = 0.25f;  // dampening shows a buffer started from zeros

// The momentum of `group` during step `step` (1-based): none at first; group 0's turned on
// after step 2, group 1's after step 4 (after the checkpoint).
float MomentumAt(int group, int step) {
  if (group == 0) return step > 2 ? 0.9f : 0.0f;
  return step > 4 ? 0.5f : 0.0f;
}

Config SgdConfig(int stage) {
  Config c;
  c.stage = stage;
  c.optimizer.type = OptimizerType::kSgd;
  c.optimizer.lr = kLr;
  c.optimizer.weight_decay = 0.0f;
  c.optimizer.param_groups = {ParamGroupOverrides{}, ParamGroupOverrides{}};
  c.buckets.reduce_bucket_elems = c.buckets.first_bucket_elems = 300;  // params straddle shards
  c.buckets.last_bucket_elems = 0;
  c.stage3.persistence_threshold = 0;
  return c;
}

// float64 torch.optim.SGD (no weight decay): the buffer is created at a param's first step
// with momentum, as the gradient itself.
struct ReferenceSgd {
  std::vector<double> w, buffer;
  void Step(const std::vector<double>& g, double momentum) {
    if (momentum != 0.0) {
      if (buffer.empty()) {
        buffer = g;
      } else {
        for (size_t i = 0; i < g.size(); ++i) buffer[i] = momentum * buffer[i] + (1.0 - kDampening) * g[i];
      }
    }
    const std::vector<double>& d = momentum != 0.0 ? buffer : g;
    for (size_t i = 0; i < w.size(); ++i) w[i] -= kLr * d[i];
  }
};

// Steps [first, last] of rank `r`, setting each group's momentum before each step.
void RunSteps(Engine& engine, int stage, int r, int first, int last) {
  for (int step = first; step <= last; ++step) {
    for (int g = 0; g < 2; ++g) {
      auto hyper = engine.GroupHyper(g);
      ASSERT_THAT(hyper, IsOk());
      hyper->momentum = MomentumAt(g, step);
      hyper->dampening = kDampening;
      ASSERT_THAT(engine.SetGroupHyper(g, *hyper), IsOk()) << "step " << step;
    }
    ASSERT_THAT(engine.BeginIteration(), IsOk());
    for (int param : {1, 0}) {
      if (stage == 3) {
        ASSERT_THAT(engine.Gather(param), IsOk());
      }
      ASSERT_THAT(engine.AccumulateGrad(param, RankGradient(param, kNumel[param], step, r).data()), IsOk());
      if (stage == 3) {
        ASSERT_THAT(engine.Release(param), IsOk());
      }
    }
    ASSERT_THAT(engine.EndBackward(), IsOk());
    ASSERT_THAT(engine.Step(), IsOk()) << "step " << step;
  }
}

std::unique_ptr<Engine> SgdEngine(int stage, comm::Communicator& comm) {
  auto created = Engine::Create(SgdConfig(stage), comm);
  EXPECT_THAT(created, IsOk());
  if (!created.ok()) return nullptr;
  Engine& e = **created;
  const bool ok = e.RegisterParam({"w", {kNumel[0]}, DType::kFP32, true, 0, 0}).ok() &&
                  e.RegisterParam({"b", {kNumel[1]}, DType::kFP32, true, 1, 1}).ok() && e.Finalize().ok() &&
                  e.SetParam(0, InitialValues(0, kNumel[0]).data()).ok() &&
                  e.SetParam(1, InitialValues(1, kNumel[1]).data()).ok();
  EXPECT_TRUE(ok) << "registering, finalizing or setting the two params failed";
  return ok ? std::move(*created) : nullptr;
}

void ExpectReference(Engine& engine) {
  for (int p = 0; p < 2; ++p) {
    const std::vector<float> initial = InitialValues(p, kNumel[p]);
    ReferenceSgd reference{std::vector<double>(initial.begin(), initial.end()), {}};
    for (int step = 1; step <= kSteps; ++step) {
      reference.Step(MeanGradient(p, kNumel[p], step, kWorld), MomentumAt(p, step));
    }
    std::vector<float> got(kNumel[p], std::nanf(""));
    ASSERT_THAT(engine.GetParam(p, got.data()), IsOk());
    for (int64_t i = 0; i < kNumel[p]; ++i) {
      ASSERT_NEAR(got[i], reference.w[i], 1e-5 * (1.0 + std::fabs(reference.w[i]))) << "param " << p << " element " << i;
    }
  }
}

TEST(EngineSgdMomentum, TurnedOnLaterStartsEachBufferFromTheGradient) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    RunOnRanks(kWorld, [&](int r, comm::Communicator& comm) {
      std::unique_ptr<Engine> engine = SgdEngine(stage, comm);
      ASSERT_NE(engine, nullptr);
      RunSteps(*engine, stage, r, 1, kSteps);
      ExpectReference(*engine);
    });
  }
}

// Saved after group 0's momentum began, loaded into an engine built without momentum: the
// buffer comes back with the groups' settings, and the run goes on as the uninterrupted one.
TEST(EngineSgdMomentum, ABufferSavedAfterMomentumBeganLoadsIntoAnEngineBuiltWithout) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    const std::string dir = testing::ScratchDir("sgd_momentum") + "/ckpt";
    RunOnRanks(kWorld, [&](int r, comm::Communicator& comm) {
      std::unique_ptr<Engine> saved = SgdEngine(stage, comm);
      ASSERT_NE(saved, nullptr);
      RunSteps(*saved, stage, r, 1, 4);
      ASSERT_THAT(saved->SaveCheckpoint(dir), IsOk());
      std::unique_ptr<Engine> resumed = SgdEngine(stage, comm);
      ASSERT_NE(resumed, nullptr);
      ASSERT_THAT(resumed->LoadCheckpoint(dir), IsOk());
      RunSteps(*resumed, stage, r, 5, kSteps);
      ExpectReference(*resumed);
    });
  }
}

}  // namespace
}  // namespace zero
