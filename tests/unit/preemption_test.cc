// Preemption: SIGTERM/SIGUSR1 become a request every rank sees at the same step boundary.
#include <gtest/gtest.h>

#include <csignal>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/engine.h"
#include "zero/preemption.h"

namespace zero {
namespace {

using testing::IsOk;
using testing::RunOnRanks;

TEST(Preemption, ASignalIsRecordedNotFatal) {
  ASSERT_THAT(InstallPreemptionHandler(), IsOk());
  ClearPreemption();
  EXPECT_FALSE(PreemptionSignalled());
  for (const int signal : {SIGUSR1, SIGTERM}) {
    ASSERT_EQ(std::raise(signal), 0);  // the default action would end the test binary
    EXPECT_TRUE(PreemptionSignalled());
    ClearPreemption();
  }
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGUSR1, SIG_DFL);
}

TEST(Preemption, EveryRankGetsTheSameAnswer) {
  for (const bool requested : {false, true}) {
    ClearPreemption();
    if (requested) RequestPreemption();
    std::vector<int> answers(3, -1);
    const std::vector<Status> statuses = RunOnRanks(3, [&](int r, comm::Communicator& c) -> Status {
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(testing::ToyConfig(2), c));
      ZERO_RETURN_IF_ERROR(testing::RegisterToyModel(*engine, testing::ToyOptions{}).status());
      ZERO_ASSIGN_OR_RETURN(const bool answer, engine->PreemptionRequested());
      answers[r] = answer ? 1 : 0;
      return absl::OkStatus();
    });
    EXPECT_THAT(statuses, ::testing::Each(IsOk()));
    EXPECT_EQ(answers, std::vector<int>(3, requested ? 1 : 0));
  }
  ClearPreemption();
}

}  // namespace
}  // namespace zero
