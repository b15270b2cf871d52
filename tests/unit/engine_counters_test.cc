// The engine's counters of host waits and gradient bytes copied, and a rank alone: at world
// size 1 every collective is an identity, so a run launches none and never waits. Through a
// communicator whose collectives complete only when waited for, every wait is counted.
#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "tests/engine/counting_communicator.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::CountingCommunicator;
using testing::IsOk;
using testing::ToyConfig;
using testing::ToyOptions;

TEST(EngineCounters, ARankAloneLaunchesNoCollectiveAndNeverWaits) {
  ToyOptions options;
  options.steps = 4;
  const int64_t fc2_weight_bytes = int64_t{options.outputs} * options.hidden * 4;
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    auto group = comm::CreateLocalGroup(1);
    ASSERT_THAT(group, IsOk());
    CountingCommunicator counting(*(*group)[0]);
    Config config = ToyConfig(stage);
    config.guard.consistency_check = true;  // its agreement is an identity too
    auto engine = Engine::Create(config, counting);
    ASSERT_THAT(engine, IsOk());
    testing::ToyResult result;
    ASSERT_THAT(testing::TrainToy(**engine, options, &result), IsOk());
    EXPECT_EQ(counting.collectives(), 0);
    const EngineCounters counters = (*engine)->counters();
    EXPECT_EQ(counters.host_waits, 0);
    EXPECT_EQ(counters.reductions_launched, 0);
    // The toy trainer hands fc2.weight over with AccumulateGrad, the others through GradBuffer.
    EXPECT_EQ(counters.grad_bytes_copied, options.steps * fc2_weight_bytes);
  }
}

TEST(EngineCounters, EveryWaitForACollectiveNotYetCompleteIsCounted) {
  ToyOptions options;
  options.steps = 3;
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    std::vector<int> collectives(2);
    std::vector<EngineCounters> counters(2);
    const std::vector<Status> statuses = testing::RunOnRanks(2, [&](int r, comm::Communicator& comm) -> Status {
      CountingCommunicator lazy(comm, /*lazy=*/true);
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(ToyConfig(stage), lazy));
      testing::ToyResult result;
      ZERO_RETURN_IF_ERROR(testing::TrainToy(*engine, options, &result));
      collectives[r] = lazy.collectives();
      counters[r] = engine->counters();
      return absl::OkStatus();
    });
    ASSERT_THAT(statuses, ::testing::Each(IsOk()));
    for (int r = 0; r < 2; ++r) {
      EXPECT_GT(collectives[r], 0);
      EXPECT_EQ(counters[r].host_waits, collectives[r]) << "each collective is waited for once, and counted";
      EXPECT_EQ(counters[r].grad_bytes_copied, options.steps * int64_t{options.outputs} * options.hidden * 4);
    }
  }
}

TEST(EngineCounters, AStage3StepAfterTheFirstAllocatesNoGatheredBuffer) {
  // Released units' buffers are reused within stage3.prefetch_elems; with 0 none is kept.
  for (int64_t window : {int64_t{50'000'000}, int64_t{0}}) {
    SCOPED_TRACE(::testing::Message() << "prefetch_elems " << window);
    Config config = ToyConfig(3);
    config.stage3.prefetch_elems = window;
    std::vector<int64_t> allocations;
    for (int steps : {2, 5}) {
      ToyOptions options;
      options.steps = steps;
      const auto runs = testing::TrainOnLocalRanks(2, config, options);
      if (HasFailure()) return;
      allocations.push_back(runs[0].counters.gather_allocations);
    }
    EXPECT_GT(allocations[0], 0);
    if (window > 0) {
      EXPECT_EQ(allocations[1], allocations[0]) << "steps 3-5 allocated gathered buffers";
    } else {
      EXPECT_GT(allocations[1], allocations[0]);
    }
  }
}

}  // namespace
}  // namespace zero
