// The gradient guard's scenarios on in-process ranks (1, 2 and 3 ranks; stages 2 and 3), each on
// a fresh group.
#include <gtest/gtest.h>

#include "tests/engine/guard_scenarios.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/status_matchers.h"

namespace zero::testing {
namespace {

class GuardTest : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};

TEST_P(GuardTest, BehavesAsPromised) {
  const auto& [name, world, stage] = GetParam();
  for (const GuardScenario& scenario : GuardScenarios()) {
    if (scenario.name != name) continue;
    const std::vector<Status> results =
        testing::RunOnRanks(world, [&](int, comm::Communicator& comm) { return scenario.run(comm, stage); });
    EXPECT_THAT(results, ::testing::Each(IsOk()));
    return;
  }
  FAIL() << "no scenario " << name;
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, GuardTest,
    ::testing::Combine(::testing::Values("ReentrantCheckpointing", "TiedEmbedding", "BranchUnusedOnOneRank",
                                         "ParamNoRankUsed", "RankSkipsEndBackward",
                                         "DifferentRegistrationOrder", "DivergedBucketLayout"),
                       ::testing::Values(1, 2, 3), ::testing::Values(2, 3)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks_stage" +
             std::to_string(std::get<2>(info.param));
    });

}  // namespace
}  // namespace zero::testing
