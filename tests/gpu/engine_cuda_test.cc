// The engine on device "cuda" (label gpu: skips without a device): the stage equivalence test
// on one GPU with in-process ranks, against the same training on the CPU and the float64
// reference; the NCCL communicator at one rank (the engine threads here keep device 0; several
// GPUs need one process per GPU, as under mpirun). On a machine without a GPU, creating a
// "cuda" engine is a clear kUnavailable.
#include <gtest/gtest.h>

#include <thread>

#include "tests/engine/toy_trainer.h"
#include "zero/communicator.h"
#include "zero/device.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::ReferenceLosses;
using testing::ToyConfig;
using testing::ToyOptions;
using testing::ToyResult;
using testing::TrainToy;

// Trains the toy model on every rank of `comms` (one thread each); returns rank 0's result.
ToyResult Train(const std::vector<comm::Communicator*>& comms, const Config& config, const ToyOptions& options) {
  const int world = static_cast<int>(comms.size());
  std::vector<ToyResult> results(world);
  std::vector<Status> statuses(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto engine = Engine::Create(config, *comms[r]);
      statuses[r] = engine.ok() ? TrainToy(**engine, options, &results[r]) : engine.status();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  for (int r = 1; r < world; ++r) EXPECT_EQ(results[r].losses, results[0].losses) << "ranks disagree";
  return results[0];
}

std::vector<comm::Communicator*> Pointers(const std::vector<std::unique_ptr<comm::Communicator>>& owned) {
  std::vector<comm::Communicator*> out;
  for (const auto& c : owned) out.push_back(c.get());
  return out;
}

TEST(EngineCuda, WithoutAGpuCreatingACudaEngineIsUnavailable) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  auto group = comm::CreateLocalGroup(1);
  Config config = ToyConfig(2);
  config.device = Device::kCuda;
  const auto engine = Engine::Create(config, *(*group)[0]);
  ASSERT_EQ(engine.status().code(), absl::StatusCode::kUnavailable) << engine.status();
  EXPECT_NE(engine.status().message().find("device \"cuda\""), std::string::npos) << engine.status();
}

TEST(EngineCuda, StagesAgreeOnOneGpuAndMatchTheCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::kFP32, DType::kBF16}) {
    ToyOptions options;
    options.dtype = dtype;
    const std::vector<double> reference = ReferenceLosses(options, ToyConfig(0));
    for (int world : {1, 3}) {
      auto group = comm::CreateLocalGroup(world);
      ASSERT_TRUE(group.ok());
      std::vector<double> stage0;
      for (int stage : {0, 1, 2, 3}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " world " << world << " stage " << stage);
        Config config = ToyConfig(stage);
        config.precision.grad = config.precision.reduce = dtype;
        const ToyResult cpu = Train(Pointers(*group), config, options);
        config.device = Device::kCuda;
        const ToyResult gpu = Train(Pointers(*group), config, options);
        if (HasFailure()) return;
        ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
        for (size_t i = 0; i < gpu.losses.size(); ++i) {
          EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-5 * cpu.losses[i] + 1e-7) << "step " << i;
          if (dtype == DType::kFP32) {
            EXPECT_NEAR(gpu.losses[i], reference[i], 1e-4 * reference[i] + 1e-7) << "step " << i;
          }
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
  auto bootstrap = comm::CreateLocalGroup(world);
  ASSERT_TRUE(bootstrap.ok());
  std::vector<std::unique_ptr<comm::Communicator>> nccl(world);
  std::vector<Status> created(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      comm::NcclOptions options;
      auto c = comm::CreateNcclCommunicator(*(*bootstrap)[r], options);
      created[r] = c.status();
      if (c.ok()) nccl[r] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : created) ASSERT_TRUE(s.ok()) << s;
  ToyOptions options;
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "nccl world " << world << " stage " << stage);
    Config config = ToyConfig(stage);
    const ToyResult cpu = Train(Pointers(*bootstrap), config, options);
    config.device = Device::kCuda;
    const ToyResult gpu = Train(Pointers(nccl), config, options);
    if (HasFailure()) return;
    for (size_t i = 0; i < gpu.losses.size(); ++i) {
      EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-5 * cpu.losses[i] + 1e-7) << "step " << i;
    }
  }
}

}  // namespace
}  // namespace zero
