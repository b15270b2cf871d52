// The engine when collectives fail: many short trainings on in-process ranks with random
// per-rank delays, random (often tiny) guard.timeout_s and random failures injected into
// collectives, at every stage. After any failure the group is broken: every rank reports an
// error, no rank completed a step that another did not, each rank's next call fails at once,
// and destroying the engines never blocks. Run under AddressSanitizer (make sanitize), this is
// also the proof that no rank touches a peer's freed buffers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "tests/engine/faulty_communicator.h"
#include "tests/engine/forwarding_communicator.h"
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

// Passes every call to `inner`; the first all-reduce of one host float (the norm's sum) returns
// from its Wait only once `resume` is set (or 10 s passed), after the collective completed.
class HoldingCommunicator final : public testing::ForwardingCommunicator {
 public:
  HoldingCommunicator(comm::Communicator& inner, const std::atomic<bool>& resume)
      : ForwardingCommunicator(inner), resume_(resume) {}
  bool held_until_resumed() const { return held_until_resumed_; }

  comm::WorkPtr AllReduce(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op,
                          int64_t tag = -1) override {
    comm::WorkPtr work = ForwardingCommunicator::AllReduce(send, recv, count, dtype, op, tag);
    if (held_ || count != 1 || dtype != DType::kFP32 || tag != comm::kHostValuesTag) return work;
    held_ = true;
    return std::make_unique<HeldWork>(std::move(work), *this);
  }

 private:
  class HeldWork final : public comm::Work {
   public:
    HeldWork(comm::WorkPtr inner, HoldingCommunicator& owner) : inner_(std::move(inner)), owner_(owner) {}
    Status Wait(double timeout_s) override {
      const Status outcome = inner_->Wait(timeout_s);
      const auto give_up = Clock::now() + std::chrono::seconds(10);
      while (!owner_.resume_ && Clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      owner_.held_until_resumed_ = owner_.resume_;
      return outcome;
    }
    bool Test() override { return inner_->Test() && owner_.resume_; }

   private:
    comm::WorkPtr inner_;
    HoldingCommunicator& owner_;
  };

  const std::atomic<bool>& resume_;
  bool held_ = false;
  bool held_until_resumed_ = false;
};

// The window the random test below found once in CI: rank 1's last collective of a step has
// completed, rank 0 returns from the step, goes on, and breaks the group, all before rank 1
// returns. Rank 1's step completed too and must say so.
TEST(EngineFailures, APeerBreakingTheGroupAfterAStepsLastCollectiveDoesNotFailTheStep) {
  // At stage 0 a toy step's last collective is the norm's sum (stage 3 gathers after it).
  std::atomic<bool> group_broken{false};
  std::vector<size_t> steps(2);
  bool held_until_broken = false;
  testing::RunOnRanks(2, [&](int r, comm::Communicator& local) {
    HoldingCommunicator holding(local, group_broken);
    comm::Communicator& comm = r == 1 ? static_cast<comm::Communicator&>(holding) : local;
    auto engine = Engine::Create(testing::ToyConfig(0), comm);
    ASSERT_THAT(engine, IsOk());
    testing::ToyOptions options;
    options.steps = 1;
    testing::ToyResult result;
    const Status trained = testing::TrainToy(**engine, options, &result);
    steps[r] = result.infos.size();
    if (r == 0) {
      EXPECT_THAT(trained, IsOk());
      float value = 1;  // a null send buffer fails this collective on every rank
      EXPECT_THAT(local.AllReduce(nullptr, &value, 1, DType::kFP32, comm::ReduceOp::kSum)->Wait(), Not(IsOk()));
      group_broken = true;
    } else {
      held_until_broken = holding.held_until_resumed();
    }
    engine->reset();
  });
  EXPECT_TRUE(held_until_broken) << "the norm's sum was not the step's last collective";
  EXPECT_EQ(steps[0], 1u);
  EXPECT_EQ(steps[1], 1u) << "rank 1 failed a step rank 0 completed";
}

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
