// Collectives on CUDA device buffers (label gpu: skips without a device): the conformance
// suite on the local backend (3 ranks sharing one GPU) and on NCCL (one rank per GPU: as many
// ranks as GPUs, bootstrapped over a local group).
#include <gtest/gtest.h>

#include <thread>

#include "tests/comm/conformance.h"

namespace zero::comm {
namespace {

std::vector<Status> OnRanks(int world, const std::function<Status(int, Communicator&)>& body) {
  auto group = CreateLocalGroup(world);
  EXPECT_TRUE(group.ok());
  std::vector<Status> results(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back([&, r] { results[r] = body(r, *(*group)[r]); });
  for (auto& t : ranks) t.join();
  return results;
}

TEST(DeviceComm, LocalBackendOnDeviceBuffers) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (const Status& s : OnRanks(3, [](int, Communicator& comm) {
         return testing::RunConformanceSuite(comm, /*pairwise_rounding=*/false, Placement::kDevice);
       })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(DeviceComm, NcclOneRankPerGpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  if (!NcclAvailable()) GTEST_SKIP() << "built without NCCL";
  const int world = CudaDeviceCount();
  for (const Status& s : OnRanks(world, [](int rank, Communicator& bootstrap) -> Status {
         NcclOptions options;
         options.device = rank;
         ZERO_ASSIGN_OR_RETURN(auto nccl, CreateNcclCommunicator(bootstrap, options));
         // NCCL's own reduction order: allow pairwise rounding of 16-bit sums.
         return testing::RunConformanceSuite(*nccl, /*pairwise_rounding=*/true, Placement::kDevice);
       })) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

}  // namespace
}  // namespace zero::comm
