// The MPI communicator on CUDA device buffers under mpirun (label gpu: skips without a
// device): staged through pinned host memory unless the MPI is CUDA-aware.
#include <gtest/gtest.h>

#include "tests/comm/conformance.h"

namespace zero::comm {
namespace {

TEST(MpiDeviceComm, ConformanceOnDeviceBuffers) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto comm = CreateMpiCommunicator(nullptr);
  ASSERT_TRUE(comm.ok()) << comm.status();
  const Status status = testing::RunConformanceSuite(**comm, /*pairwise_rounding=*/true, Placement::kDevice);
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace zero::comm
