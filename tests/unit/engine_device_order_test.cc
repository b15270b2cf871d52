// The engine on a device model whose queued work runs only when the host waits for it
// (tests/engine/deferred_device.h): it must give the CPU engine's bits, and its host waits
// show what a GPU step would drain the queue for. A rank alone decides its norm and clipping
// on the device, so a steady step there never waits (sync_grad_norm false); nor do ranks whose
// communicator lets the stream wait for its collectives (NCCL).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "tests/engine/deferred_device.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::DeferredDeviceOps;
using testing::IsOk;
using testing::ToyConfig;
using testing::ToyOptions;
using testing::ToyResult;

// Clipping on: a norm decided on the device must reach the kernels.
Config ClippedConfig(int stage, bool sync_grad_norm) {
  Config config = ToyConfig(stage);
  config.clip_grad_norm = 0.05f;
  config.sync_grad_norm = sync_grad_norm;
  return config;
}

struct ModelRun {
  ToyResult result;
  EngineCounters counters;
  float last_grad_norm = 0.0f;
};

// How the ranks' collectives meet the device model's stream.
enum class Collectives {
  kUnordered,      // the in-process communicator: the engine finishes queued work first
  kStreamOrdered,  // through StreamOrderedCommunicator, as NCCL on a GPU
};

// Trains on `world` in-process ranks, each engine on a DeferredDeviceOps; rank 0's run.
ModelRun TrainOnModel(int world, const Config& config, ToyOptions options,
                      Collectives collectives = Collectives::kUnordered) {
  std::vector<ModelRun> runs(world);
  const std::vector<Status> statuses = testing::RunOnRanks(world, [&](int r, comm::Communicator& local) -> Status {
    DeferredDeviceOps* ops = nullptr;
    testing::StreamOrderedCommunicator ordered(local, &ops);
    comm::Communicator& comm = collectives == Collectives::kStreamOrdered ? ordered : local;
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                          runtime::CreateEngine(config, comm, testing::DeferredDeviceFactory(&ops)));
    ToyOptions mine = options;
    mine.device_work = [ops] { return ops->RunTrainerWork(); };
    ZERO_RETURN_IF_ERROR(testing::TrainToy(*engine, mine, &runs[r].result));
    runs[r].counters = engine->counters();  // before LastGradNorm's own wait
    ZERO_ASSIGN_OR_RETURN(runs[r].last_grad_norm, engine->LastGradNorm());
    return absl::OkStatus();
  });
  EXPECT_THAT(statuses, ::testing::Each(IsOk()));
  return runs[0];
}

// The same training with the CPU's synchronous ops.
ToyResult TrainOnCpu(int world, const Config& config, const ToyOptions& options) {
  const auto runs = testing::TrainOnLocalRanks(world, config, options);
  return runs.empty() ? ToyResult{} : runs[0].result;
}

void ExpectSameBits(const ToyResult& model, const ToyResult& cpu) {
  ASSERT_EQ(model.losses.size(), cpu.losses.size());
  for (size_t s = 0; s < cpu.losses.size(); ++s) EXPECT_EQ(model.losses[s], cpu.losses[s]) << "step " << s;
  ASSERT_EQ(model.final_params.size(), cpu.final_params.size());
  for (size_t p = 0; p < cpu.final_params.size(); ++p) {
    EXPECT_EQ(model.final_params[p], cpu.final_params[p]) << "param " << p;
  }
}

// The norm the model reported against the CPU's. With clipping it is the CPU's pass over the
// same spans: the same bits. Without, the model's steps sum the squares per chunk as a GPU's
// kernels do (DeviceOps::squares_in_step), the chunks' float64 sums associated otherwise.
void ExpectSameNorm(float model, float cpu, const Config& config) {
  if (config.clip_grad_norm > 0.0f) {
    EXPECT_EQ(model, cpu);
  } else {
    EXPECT_FLOAT_EQ(model, cpu);
  }
}

// `world` ranks trained for 2 and for 5 steps, on the model and on the CPU: the same bits each
// time (and the model's last norm, read when asked, is the CPU's); the host waits of steps 3-5.
int64_t WaitsOfThreeSteadySteps(const Config& config, int world = 1,
                                Collectives collectives = Collectives::kUnordered, ToyOptions options = {}) {
  std::vector<int64_t> waits;
  for (int steps : {2, 5}) {
    options.steps = steps;
    const ModelRun model = TrainOnModel(world, config, options, collectives);
    const ToyResult cpu = TrainOnCpu(world, config, options);
    if (::testing::Test::HasFailure()) return -1;
    ExpectSameBits(model.result, cpu);
    ExpectSameNorm(model.last_grad_norm, cpu.infos.back().grad_norm, config);
    EXPECT_GT(cpu.infos.back().grad_norm, config.clip_grad_norm) << "clipping was exercised";
    if (config.sync_grad_norm) {
      ExpectSameNorm(model.result.infos.back().grad_norm, cpu.infos.back().grad_norm, config);
    } else {
      EXPECT_TRUE(std::isnan(model.result.infos.back().grad_norm)) << "the norm stayed on the device";
    }
    waits.push_back(model.counters.host_waits);
  }
  return waits[1] - waits[0];
}

TEST(DeviceOrder, ARankAloneStepsWithTheCpuBitsAndASteadyStepNeverWaits) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    EXPECT_EQ(WaitsOfThreeSteadySteps(ClippedConfig(stage, /*sync_grad_norm=*/false)), 0);
  }
}

TEST(DeviceOrder, SyncGradNormWaitsOncePerStepForTheNorm) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    EXPECT_EQ(WaitsOfThreeSteadySteps(ClippedConfig(stage, /*sync_grad_norm=*/true)), 3);
  }
}

TEST(DeviceOrder, RanksWithAnUnorderedCommunicatorWaitForTheStreamBeforeEachCollective) {
  // The in-process communicator does not order itself after the stream: the engine finishes
  // the queued work before each collective, or the collective reads unwritten buffers.
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    const Config config = ClippedConfig(stage, /*sync_grad_norm=*/false);
    ToyOptions options;
    options.steps = 4;
    const ModelRun model = TrainOnModel(3, config, options);
    const ToyResult cpu = TrainOnCpu(3, config, options);
    if (HasFailure()) return;
    ExpectSameBits(model.result, cpu);
    EXPECT_EQ(model.last_grad_norm, cpu.infos.back().grad_norm);
    EXPECT_GT(model.counters.host_waits, options.steps);
  }
}

TEST(DeviceOrder, RanksWhoseCollectivesTheStreamWaitsForNeverWaitInASteadyStep) {
  // As NCCL on a GPU: bucket reductions, the norm's sum and the gathers after the step are
  // waited for by the stream, so steps 3-5 add no host wait, at every stage.
  // A rank alone hands complete works (copies, no collective) to the same path.
  for (int world : {1, 3}) {
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "world " << world << " stage " << stage);
      Config config = ClippedConfig(stage, /*sync_grad_norm=*/false);
      config.buckets.pool_buffers = 1;  // stage 2-3: every bucket after the first reuses a buffer
      EXPECT_EQ(WaitsOfThreeSteadySteps(config, world, Collectives::kStreamOrdered), 0);
    }
  }
}

TEST(DeviceOrder, WithoutClippingTheStepsKernelsSumTheNormAndASteadyStepNeverWaits) {
  // Nothing waits for the norm: the optimizer's kernels write the squares' partials as they
  // step, their sum is taken and summed over ranks after the step, and the norm read when
  // asked is the CPU's. Stage 0 at 3 ranks steps whole buckets: its norm keeps its own pass.
  // Gradients lent where they are (ToyOptions::lend_grads, one rank) step per param, and
  // biases in a group of their own (stages 0-2) take launches of their own: each launch's
  // partials follow the previous one's.
  for (int world : {1, 3}) {
    for (int stage : {0, 1, 2, 3}) {
      for (int variant = 0; variant < 3; ++variant) {
        ToyOptions options;
        options.lend_grads = variant == 1;
        options.bias_group = variant == 2 ? 1 : 0;
        if ((options.lend_grads && world > 1) || (options.bias_group > 0 && stage == 3)) continue;
        SCOPED_TRACE(::testing::Message() << "world " << world << " stage " << stage << " variant " << variant);
        Config config = ClippedConfig(stage, /*sync_grad_norm=*/false);
        config.clip_grad_norm = 0.0f;
        config.optimizer.param_groups.resize(2);
        config.optimizer.param_groups[1].weight_decay = 0.0f;
        EXPECT_EQ(WaitsOfThreeSteadySteps(config, world, Collectives::kStreamOrdered, options), 0);
        // Read on the host: taken before the step, as with clipping; where the host waits
        // anyway, several ranks also compare their group settings (EngineImpl::CheckGroupsAgree).
        config.sync_grad_norm = true;
        EXPECT_EQ(WaitsOfThreeSteadySteps(config, world, Collectives::kStreamOrdered, options), world > 1 ? 6 : 3);
      }
    }
  }
}

TEST(DeviceOrder, LastGradNormBeforeAnyStepIsAnError) {
  auto group = comm::CreateLocalGroup(1);
  ASSERT_THAT(group, IsOk());
  DeferredDeviceOps* ops = nullptr;
  auto engine = runtime::CreateEngine(ClippedConfig(2, false), *(*group)[0], testing::DeferredDeviceFactory(&ops));
  ASSERT_THAT(engine, IsOk());
  ASSERT_THAT(testing::RegisterToyModel(**engine, ToyOptions{}), IsOk());
  const StatusOr<float> norm = (*engine)->LastGradNorm();
  EXPECT_EQ(norm.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace zero
