// The engine on device "cuda" (label gpu: skips without a device): the stage equivalence test
// on one GPU with in-process ranks, against the same training on the CPU and the float64
// reference; the NCCL communicator at one rank (the engine threads here keep device 0; several
// GPUs need one process per GPU, as under mpirun). On a machine without a GPU, creating a
// "cuda" engine is a clear kUnavailable.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/device.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::ReferenceLosses;
using testing::RunOnRanks;
using testing::StatusIs;
using testing::ToyConfig;
using testing::ToyOptions;
using testing::ToyResult;
using testing::TrainToy;

// Trains the toy model on `world` in-process ranks, each on its local communicator or, with
// `nccl`, on an NCCL communicator bootstrapped over it; returns rank 0's result.
ToyResult Train(int world, const Config& config, const ToyOptions& options, bool nccl = false) {
  std::vector<ToyResult> results(world);
  const std::vector<Status> statuses = RunOnRanks(world, [&](int r, comm::Communicator& local) -> Status {
    std::unique_ptr<comm::Communicator> owned;
    comm::Communicator* comm = &local;
    if (nccl) {
      ZERO_ASSIGN_OR_RETURN(owned, comm::CreateNcclCommunicator(local, comm::NcclOptions{}));
      comm = owned.get();
    }
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, *comm));
    return TrainToy(*engine, options, &results[r]);
  });
  EXPECT_THAT(statuses, Each(IsOk()));
  for (int r = 1; r < world; ++r) EXPECT_EQ(results[r].losses, results[0].losses) << "ranks disagree";
  return results[0];
}

// A GPU engine of one rank trained with `options`, kept for the test's own reads (its
// communicator with it).
struct GpuRun {
  std::vector<std::unique_ptr<comm::Communicator>> group;
  std::unique_ptr<Engine> engine;
  ToyResult result;
};

// Trains `config` on the GPU at one rank (into `*run`) and checks its losses against `cpu`'s.
void TrainOnOneGpuAsTheCpu(Config config, const ToyOptions& options, const ToyResult& cpu, GpuRun* run) {
  config.device = Device::kCuda;
  auto group = comm::CreateLocalGroup(1);
  ASSERT_THAT(group, IsOk());
  run->group = std::move(*group);
  auto engine = Engine::Create(config, *run->group[0]);
  ASSERT_THAT(engine, IsOk());
  run->engine = std::move(*engine);
  ASSERT_THAT(TrainToy(*run->engine, options, &run->result), IsOk());
  ASSERT_EQ(run->result.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_NEAR(run->result.losses[i], cpu.losses[i], 1e-5 * cpu.losses[i] + 1e-7) << "step " << i;
  }
}

TEST(EngineCuda, WithoutAGpuCreatingACudaEngineIsUnavailable) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  auto group = comm::CreateLocalGroup(1);
  Config config = ToyConfig(2);
  config.device = Device::kCuda;
  EXPECT_THAT(Engine::Create(config, *(*group)[0]),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("device \"cuda\"")));
}

TEST(EngineCuda, StagesAgreeOnOneGpuAndMatchTheCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::kFP32, DType::kBF16}) {
    ToyOptions options;
    options.dtype = dtype;
    const std::vector<double> reference = ReferenceLosses(options, ToyConfig(0));
    for (int world : {1, 3}) {
      std::vector<double> stage0;
      for (int stage : {0, 1, 2, 3}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " world " << world << " stage " << stage);
        Config config = ToyConfig(stage);
        config.precision.grad = config.precision.reduce = dtype;
        const ToyResult cpu = Train(world, config, options);
        config.device = Device::kCuda;
        const ToyResult gpu = Train(world, config, options);
        if (HasFailure()) return;
        ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
        for (size_t i = 0; i < gpu.losses.size(); ++i) {
          EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-5 * cpu.losses[i] + 1e-7) << "step " << i;
          if (dtype == DType::kFP32) {
            EXPECT_NEAR(gpu.losses[i], reference[i], 1e-4 * reference[i] + 1e-7) << "step " << i;
          }
        }
        // The norms read on the host (sync_grad_norm): taken before the step, as the CPU's.
        ASSERT_EQ(gpu.infos.size(), cpu.infos.size());
        for (size_t i = 0; i < gpu.infos.size(); ++i) {
          EXPECT_NEAR(gpu.infos[i].grad_norm, cpu.infos[i].grad_norm, 1e-5 * cpu.infos[i].grad_norm + 1e-7)
              << "grad norm, step " << i;
        }
        if (stage == 0) {
          stage0 = gpu.losses;
        } else {
          EXPECT_EQ(gpu.losses, stage0) << "on the GPU, stage " << stage << " is not bit-identical to stage 0";
        }
      }
    }
  }
}

TEST(EngineCuda, NcclFollowsTheCpuTrajectory) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  if (!comm::NcclAvailable()) GTEST_SKIP() << "built without NCCL";
  const int world = 1;
  ToyOptions options;
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "nccl world " << world << " stage " << stage);
    Config config = ToyConfig(stage);
    const ToyResult cpu = Train(world, config, options);
    config.device = Device::kCuda;
    const ToyResult gpu = Train(world, config, options, /*nccl=*/true);
    if (HasFailure()) return;
    for (size_t i = 0; i < gpu.losses.size(); ++i) {
      EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-5 * cpu.losses[i] + 1e-7) << "step " << i;
    }
  }
}

TEST(EngineCuda, ASteadyStepOnOneRankWaitsOnlyForAHostGradient) {
  // The norm and the clip coefficient stay on the device (sync_grad_norm false) and a rank
  // alone runs no collective, so the engine waits only where the toy trainer hands it
  // fc2.weight's gradient from host memory (staged with one synchronous copy): steps 3-5 add
  // exactly 3 host waits, and the losses are the CPU's.
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    Config config = ToyConfig(stage);
    config.clip_grad_norm = 0.05f;
    config.sync_grad_norm = false;
    std::vector<int64_t> waits;
    for (int steps : {2, 5}) {
      ToyOptions options;
      options.steps = steps;
      const ToyResult cpu = Train(1, config, options);
      GpuRun gpu;
      TrainOnOneGpuAsTheCpu(config, options, cpu, &gpu);
      if (HasFatalFailure()) return;
      waits.push_back(gpu.engine->counters().host_waits);
      auto norm = gpu.engine->LastGradNorm();
      ASSERT_THAT(norm, IsOk());
      EXPECT_NEAR(*norm, cpu.infos.back().grad_norm, 1e-5 * cpu.infos.back().grad_norm);
    }
    EXPECT_EQ(waits[1] - waits[0], 3) << "steps 3-5 waited for the GPU beyond the host gradient's copy";
  }
}

TEST(EngineCuda, WithoutClippingTheNormComesFromTheStepsOwnKernels) {
  // Nothing reads the norm before Step returns (sync_grad_norm false, no clipping): the AdamW
  // kernel sums the gradients' squares as it steps, and LastGradNorm is the CPU's norm, with
  // the CPU's trajectory. bf16 gradients too, and biases in a second optimizer group (stages
  // 0-2: a launch of their own, whose partials follow the first launch's).
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::kFP32, DType::kBF16}) {
    for (int stage : {0, 1, 2, 3}) {
      for (int bias_group : {0, 1}) {
        if (bias_group == 1 && stage == 3) continue;
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " stage " << stage << " bias group " << bias_group);
        Config config = ToyConfig(stage);
        config.sync_grad_norm = false;
        config.precision.grad = config.precision.reduce = dtype;
        config.optimizer.param_groups.resize(2);
        config.optimizer.param_groups[1].weight_decay = 0.0f;
        ToyOptions options;
        options.steps = 6;
        options.dtype = dtype;
        options.bias_group = bias_group;
        const ToyResult cpu = Train(1, config, options);
        GpuRun gpu;
        TrainOnOneGpuAsTheCpu(config, options, cpu, &gpu);
        if (HasFatalFailure()) return;
        auto norm = gpu.engine->LastGradNorm();
        ASSERT_THAT(norm, IsOk());
        EXPECT_NEAR(*norm, cpu.infos.back().grad_norm, 1e-5 * cpu.infos.back().grad_norm);
      }
    }
  }
}

}  // namespace
}  // namespace zero
