// The engine under mpirun: the stage equivalence test on the MPI communicator (stages 0-3
// agree within 1e-5 relative and match a float64 single-process AdamW), with every rank
// holding identical params after each step; a preemption request on one process reaches
// every rank at the same step.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/preemption.h"

namespace zero {
namespace {

using testing::IsOk;

TEST(MpiEngine, StagesFollowTheSameLossTrajectory) {
  auto comm = comm::CreateMpiCommunicator(nullptr);
  ASSERT_THAT(comm, IsOk());
  testing::ToyOptions options;
  const std::vector<double> reference = testing::ReferenceLosses(options, testing::ToyConfig(0));
  std::vector<double> stage0;
  for (int stage : {0, 1, 2, 3}) {
    auto engine = Engine::Create(testing::ToyConfig(stage), **comm);
    ASSERT_THAT(engine, IsOk());
    testing::ToyResult result;
    ASSERT_THAT(testing::TrainToy(**engine, options, &result), IsOk()) << "stage " << stage;
    if (stage == 0) stage0 = result.losses;
    for (size_t i = 0; i < result.losses.size(); ++i) {
      EXPECT_NEAR(result.losses[i], stage0[i], 1e-5 * stage0[i]) << "stage " << stage << " step " << i;
      EXPECT_NEAR(result.losses[i], reference[i], 1e-4 * reference[i]) << "stage " << stage << " step " << i;
    }
    // Every rank must hold the same final params: compare a checksum across ranks.
    double checksum = 0;
    for (const auto& part : result.final_params) {
      for (size_t i = 0; i < part.size(); ++i) checksum += part[i] * (1.0 + 1e-3 * (i % 7));
    }
    float mine = static_cast<float>(checksum), low = mine, high = mine;
    ASSERT_THAT((*comm)->AllReduce(&high, &high, 1, DType::kFP32, comm::ReduceOp::kMax)->Wait(60), IsOk());
    low = -low;
    ASSERT_THAT((*comm)->AllReduce(&low, &low, 1, DType::kFP32, comm::ReduceOp::kMax)->Wait(60), IsOk());
    EXPECT_EQ(high, -low) << "ranks hold different params at stage " << stage;
  }
}

TEST(MpiEngine, APreemptionRequestOnOneProcessReachesEveryRank) {
  auto comm = comm::CreateMpiCommunicator(nullptr);
  ASSERT_THAT(comm, IsOk());
  auto engine = Engine::Create(testing::ToyConfig(2), **comm);
  ASSERT_THAT(engine, IsOk());
  ASSERT_THAT(testing::RegisterToyModel(**engine, testing::ToyOptions{}), IsOk());
  ClearPreemption();
  auto before = (*engine)->PreemptionRequested();
  ASSERT_THAT(before, IsOk());
  EXPECT_FALSE(*before);
  const int last = (*comm)->size() - 1;  // as if only this process got the scheduler's signal
  if ((*comm)->rank() == last) RequestPreemption();
  auto after = (*engine)->PreemptionRequested();
  ASSERT_THAT(after, IsOk());
  EXPECT_TRUE(*after) << "rank " << (*comm)->rank() << " did not see rank " << last << "'s request";
  ClearPreemption();
}

}  // namespace
}  // namespace zero
