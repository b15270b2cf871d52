// The stage equivalence test on in-process ranks: bit-identical loss trajectories across stages
// 0-3 at every world size, matching a float64 single-process AdamW (and LAMB); bf16 params with
// fp32 masters; gradient accumulation; reductions overlapping backward.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::ReferenceLosses;
using testing::ToyConfig;
using testing::ToyOptions;
using testing::TrainOnLocalRanks;

TEST(EngineStages, SameLossTrajectoryAtEveryStageAndWorldSize) {
  ToyOptions options;
  const std::vector<double> reference = ReferenceLosses(options, ToyConfig(0));
  ASSERT_LT(reference.back(), 0.5 * reference.front()) << "the reference model must learn";
  for (int world : {1, 2, 3, 4}) {
    std::vector<double> stage0;
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "world " << world << " stage " << stage);
      const auto runs = TrainOnLocalRanks(world, ToyConfig(stage), options);
      if (HasFailure()) return;
      const std::vector<double>& losses = runs[0].result.losses;
      ASSERT_EQ(losses.size(), reference.size());
      for (int r = 1; r < world; ++r) {
        EXPECT_EQ(runs[r].result.losses, losses) << "ranks disagree";
        EXPECT_EQ(runs[r].result.final_params, runs[0].result.final_params);
      }
      if (stage == 0) {
        stage0 = losses;
      } else {
        EXPECT_EQ(losses, stage0) << "stage " << stage << " is not bit-identical to stage 0";
      }
      for (size_t i = 0; i < losses.size(); ++i) {
        ASSERT_NEAR(losses[i], reference[i], 1e-4 * reference[i] + 1e-7) << "step " << i;
      }
    }
  }
}

// LAMB's trust ratio needs each param's whole norm, summed over the ranks holding its parts.
TEST(EngineStages, LambMatchesFloat64ReferenceAtEveryStage) {
  ToyOptions options;
  options.steps = 30;
  Config base = ToyConfig(0);
  base.optimizer.type = OptimizerType::kLamb;
  base.optimizer.eps = 1e-6f;
  const std::vector<double> reference = ReferenceLosses(options, base);
  ASSERT_LT(reference.back(), 0.7 * reference.front());
  for (int world : {1, 2, 3}) {
    for (int stage : {0, 1, 2, 3}) {
      Config config = ToyConfig(stage);
      config.optimizer = base.optimizer;
      const auto runs = TrainOnLocalRanks(world, config, options);
      if (HasFailure()) return;
      for (size_t i = 0; i < reference.size(); ++i) {
        ASSERT_NEAR(runs[0].result.losses[i], reference[i], 1e-4 * reference[i])
            << "world " << world << " stage " << stage << " step " << i;
      }
    }
  }
}

TEST(EngineStages, Bf16ParamsWithFp32MasterAgreeAcrossStages) {
  ToyOptions options;
  options.dtype = DType::kBF16;
  options.steps = 20;
  std::vector<double> stage0;
  for (int stage : {0, 1, 2, 3}) {
    Config config = ToyConfig(stage);
    config.precision.param = config.precision.grad = config.precision.reduce = DType::kBF16;
    const auto runs = TrainOnLocalRanks(3, config, options);
    if (HasFailure()) return;
    if (stage == 0) {
      stage0 = runs[0].result.losses;
      EXPECT_LT(stage0.back(), stage0.front());
    } else {
      EXPECT_EQ(runs[0].result.losses, stage0) << "stage " << stage;
    }
  }
}

TEST(EngineStages, GradientAccumulationMatchesOneBigBatch) {
  ToyOptions options;
  options.steps = 10;
  for (int stage : {0, 1, 2, 3}) {
    const auto single = TrainOnLocalRanks(2, ToyConfig(stage), options);
    Config config = ToyConfig(stage);
    config.gradient_accumulation_steps = 3;
    ToyOptions accumulated = options;
    accumulated.micro_batches = 3;
    const auto multi = TrainOnLocalRanks(2, config, accumulated);
    if (HasFailure()) return;
    for (size_t i = 0; i < single[0].result.losses.size(); ++i) {
      EXPECT_NEAR(multi[0].result.losses[i], single[0].result.losses[i], 1e-5 * single[0].result.losses[i])
          << "stage " << stage << " step " << i;
    }
  }
}

TEST(EngineStages, ReductionsOverlapBackward) {
  ToyOptions options;
  options.steps = 3;
  for (int stage : {0, 1, 2, 3}) {
    const auto runs = TrainOnLocalRanks(2, ToyConfig(stage), options);
    if (HasFailure()) return;
    // The toy trainer marks every param ready during backward, so every bucket's collective
    // (several per step) starts before EndBackward() is called.
    EXPECT_GT(runs[0].counters.reductions_launched, 3) << "stage " << stage;
    EXPECT_EQ(runs[0].counters.reductions_before_end_backward, runs[0].counters.reductions_launched);
    // Stage 2 has more buckets than its 2 pool buffers, so later buckets wait for one; stage 3's
    // buckets are the toy's 2 units, which fit; stages 0-1 have no pool.
    if (stage == 2) {
      EXPECT_GT(runs[0].counters.pool_waits, 0);
    } else {
      EXPECT_EQ(runs[0].counters.pool_waits, 0) << "stage " << stage;
    }
    Config no_overlap = ToyConfig(stage);
    no_overlap.buckets.overlap = false;
    const auto late = TrainOnLocalRanks(2, no_overlap, options);
    EXPECT_EQ(late[0].counters.reductions_before_end_backward, 0);
    EXPECT_EQ(late[0].result.losses, runs[0].result.losses);
  }
}

}  // namespace
}  // namespace zero
