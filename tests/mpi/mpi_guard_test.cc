// The gradient guard's scenarios under mpirun, each on a fresh duplicate of MPI_COMM_WORLD.
#include <gtest/gtest.h>

#include "tests/engine/guard_scenarios.h"
#include "zero/communicator.h"

namespace zero::testing {
namespace {

TEST(MpiGuard, EveryScenarioBehavesAsPromised) {
  for (int stage : {2, 3}) {
  for (const GuardScenario& scenario : GuardScenarios()) {
    auto comm = comm::CreateMpiCommunicator(nullptr);
    ASSERT_TRUE(comm.ok()) << comm.status();
    const Status status = scenario.run(**comm, stage);
    EXPECT_TRUE(status.ok()) << scenario.name << " at stage " << stage << " on rank " << (*comm)->rank() << ": "
                             << status;
    // Scenarios that strand a collective leave their communicator behind; meet on a fresh one.
    auto meet = comm::CreateMpiCommunicator(nullptr);
    ASSERT_TRUE(meet.ok());
    ASSERT_TRUE((*meet)->Barrier()->Wait(60).ok());
  }
  }
}

}  // namespace
}  // namespace zero::testing
