// Collectives on CUDA device buffers (label gpu: skips without a device): the conformance
// suite on the local backend (3 ranks sharing one GPU), on the external communicator (device
// buffers staged through host memory for a table over in-process groups), and on NCCL (one
// rank per GPU: as many ranks as GPUs, bootstrapped over a local group, and over an external
// communicator as zerort.torch does under torchrun).
#include <gtest/gtest.h>

#include "tests/comm/conformance.h"
#include "tests/comm/local_table.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/status_matchers.h"

namespace zero::comm {
namespace {

using ::testing::Each;
using zero::testing::IsOk;
using zero::testing::RunOnRanks;

TEST(DeviceComm, LocalBackendOnDeviceBuffers) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_THAT(RunOnRanks(3, [](int, Communicator& comm) {
    return testing::RunConformanceSuite(comm, /*pairwise_rounding=*/false, Placement::kDevice);
  }), Each(IsOk()));
}

TEST(DeviceComm, NcclOneRankPerGpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  if (!NcclAvailable()) GTEST_SKIP() << "built without NCCL";
  const int world = CudaDeviceCount();
  EXPECT_THAT(RunOnRanks(world, [](int rank, Communicator& bootstrap) -> Status {
    NcclOptions options;
    options.device = rank;
    ZERO_ASSIGN_OR_RETURN(auto nccl, CreateNcclCommunicator(bootstrap, options));
    // NCCL's own reduction order: allow pairwise rounding of 16-bit sums.
    return testing::RunConformanceSuite(*nccl, /*pairwise_rounding=*/true, Placement::kDevice);
  }), Each(IsOk()));
}

TEST(DeviceComm, ExternalBackendStagesDeviceBuffers) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  testing::TableLedger ledger;
  EXPECT_THAT(testing::OnExternalRanks(3, ledger, [](int, Communicator& comm) {
    return testing::RunConformanceSuite(comm, /*pairwise_rounding=*/false, Placement::kDevice);
  }), Each(IsOk()));
  EXPECT_EQ(ledger.held, 0);
}

TEST(DeviceComm, NcclBootstrappedOverAnExternalCommunicator) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  if (!NcclAvailable()) GTEST_SKIP() << "built without NCCL";
  testing::TableLedger ledger;
  EXPECT_THAT(testing::OnExternalRanks(CudaDeviceCount(), ledger, [](int rank, Communicator& bootstrap) -> Status {
    NcclOptions options;
    options.device = rank;
    ZERO_ASSIGN_OR_RETURN(auto nccl, CreateNcclCommunicator(bootstrap, options));
    return testing::RunConformanceSuite(*nccl, /*pairwise_rounding=*/true, Placement::kDevice);
  }), Each(IsOk()));
}

}  // namespace
}  // namespace zero::comm
