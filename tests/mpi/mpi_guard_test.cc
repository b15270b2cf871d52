// The gradient guard's scenarios under mpirun, each on a fresh duplicate of MPI_COMM_WORLD.
#include <gtest/gtest.h>

#include "tests/engine/guard_scenarios.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"

namespace zero::testing {
namespace {

TEST(MpiGuard, EveryScenarioBehavesAsPromised) {
  for (int stage : {2, 3}) {
  for (const GuardScenario& scenario : GuardScenarios()) {
    auto comm = comm::CreateMpiCommunicator(nullptr);
    ASSERT_THAT(comm, IsOk());
    EXPECT_THAT(scenario.run(**comm, stage), IsOk())
        << scenario.name << " at stage " << stage << " on rank " << (*comm)->rank();
    // Scenarios that strand a collective leave their communicator behind; meet on a fresh one.
    auto meet = comm::CreateMpiCommunicator(nullptr);
    ASSERT_THAT(meet, IsOk());
    ASSERT_THAT((*meet)->Barrier()->Wait(60), IsOk());
  }
  }
}

}  // namespace
}  // namespace zero::testing
