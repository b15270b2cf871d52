// The MPI communicator on CUDA device buffers under mpirun (label gpu: skips without a
// device): staged through pinned host memory unless the MPI is CUDA-aware.
#include <gtest/gtest.h>

#include "tests/comm/conformance.h"
#include "tests/status_matchers.h"

namespace zero::comm {
namespace {

using zero::testing::IsOk;

TEST(MpiDeviceComm, ConformanceOnDeviceBuffers) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto comm = CreateMpiCommunicator(nullptr);
  ASSERT_THAT(comm, IsOk());
  EXPECT_THAT(testing::RunConformanceSuite(**comm, /*pairwise_rounding=*/true, Placement::kDevice), IsOk());
}

}  // namespace
}  // namespace zero::comm
