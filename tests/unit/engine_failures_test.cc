// The engine when collectives fail: many short trainings on in-process ranks with random
// per-rank delays, random (often tiny) guard.timeout_s and random failures injected into
// collectives, at every stage. After any failure the group is broken: every rank reports an
// error, no rank completed a step that another did not, each rank's next call fails at once,
// and destroying the engines never blocks. Run under AddressSanitizer (make sanitize), this is
// also the proof that no rank touches a peer's freed buffers.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "tests/engine/faulty_communicator.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::Matcher;
using ::testing::Not;
using testing::IsOk;
using Clock = std::chrono::steady_clock;

// A call that blocked waited for the 5 s timeout some rounds use (or forever); the bounds
// below are half of it, far above what a loaded machine adds to a call that does not block.
constexpr double kBlockedS = 2.5;

struct RankOutcome {
  Status trained;
  size_t steps = 0;          // steps this rank completed
  Status next_call;          // BeginIteration after the failure
  double next_call_s = 0;    // how long it took
  double destroy_s = 0;      // how long destroying the engine took
};

TEST(EngineFailures, RandomDelaysTimeoutsAndFailuresLeaveEveryRankInTheSameState) {
  constexpr int kRounds = 48;
  std::mt19937 seeds(4242);
  int failed_rounds = 0, completed_rounds = 0;
  for (int round = 0; round < kRounds; ++round) {
    const int world = 2 + static_cast<int>(seeds() % 2);
    const int stage = static_cast<int>(seeds() % 4);
    Config config = testing::ToyConfig(stage);
    config.guard.timeout_s = seeds() % 2 == 0 ? 1e-6 * (1 + seeds() % 3000) : 5.0;
    const double failure_probability = seeds() % 3 == 0 ? 0.02 : 0.0;
    testing::ToyOptions options;
    options.steps = 6;
    std::vector<RankOutcome> outcomes(world);
    std::vector<uint32_t> rank_seeds(world);
    for (auto& seed : rank_seeds) seed = seeds();
    testing::RunOnRanks(world, [&](int r, comm::Communicator& local) {
      testing::FaultyCommunicator comm(local, rank_seeds[r], 0.3, failure_probability);
      RankOutcome& out = outcomes[r];
      auto engine = Engine::Create(config, comm);
      ASSERT_THAT(engine, IsOk());
      testing::ToyResult result;
      out.trained = testing::TrainToy(**engine, options, &result);
      out.steps = result.infos.size();
      if (!out.trained.ok()) {
        const auto start = Clock::now();
        out.next_call = (*engine)->BeginIteration();
        out.next_call_s = std::chrono::duration<double>(Clock::now() - start).count();
      }
      const auto start = Clock::now();
      engine->reset();
      out.destroy_s = std::chrono::duration<double>(Clock::now() - start).count();
    });
    const bool any_failed = !outcomes[0].trained.ok() || !outcomes[world - 1].trained.ok() ||
                            (world > 2 && !outcomes[1].trained.ok());
    (any_failed ? failed_rounds : completed_rounds) += 1;
    for (int r = 0; r < world; ++r) {
      const RankOutcome& out = outcomes[r];
      SCOPED_TRACE(::testing::Message() << "round " << round << ", stage " << stage << ", " << world
                                        << " ranks, timeout " << config.guard.timeout_s << " s, rank " << r);
      EXPECT_THAT(out.trained, any_failed ? Matcher<const Status&>(Not(IsOk())) : IsOk());
      EXPECT_EQ(out.steps, outcomes[0].steps) << "a rank completed a step another did not";
      EXPECT_LT(out.destroy_s, kBlockedS) << "destroying the engine blocked";
      if (!any_failed) continue;
      EXPECT_THAT(out.next_call, Not(IsOk()));
      EXPECT_NE(out.next_call.message().find("broken"), std::string::npos) << out.next_call;
      EXPECT_LT(out.next_call_s, kBlockedS) << "the next call did not fail fast";
    }
  }
  // The random schedule exercised both outcomes.
  EXPECT_GT(failed_rounds, kRounds / 8);
  EXPECT_GT(completed_rounds, kRounds / 8);
}

}  // namespace
}  // namespace zero
