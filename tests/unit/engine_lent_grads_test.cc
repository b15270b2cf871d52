// Gradients lent instead of copied (Engine::LendGrad): on one rank, where the copy is all the
// engine would do, the step reads the trainer's memory where it is (no byte copied) and trains
// bit for bit as with copied gradients, at every stage and with every optimizer; on several
// ranks the reduction reads a param that fills its bucket alone where it is (taking no bucket
// buffer), and copies the rest; with several micro-batches nothing is lent; a second gradient
// for a lent param adds to it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::IsOk;
using testing::RunOnRanks;
using testing::ToyConfig;
using testing::ToyOptions;
using testing::TrainOnLocalRanks;

// The toy model's gradient bytes per step in fp32, all four params.
int64_t ToyGradBytes(const ToyOptions& o) {
  return 4 * (int64_t{o.hidden} * o.inputs + o.hidden + int64_t{o.outputs} * o.hidden + o.outputs);
}

// Trains on `world` ranks twice, gradients handed over by copy then lent: {copied, lent}.
struct CopiedAndLent {
  std::vector<testing::RankRun> copied, lent;
};
CopiedAndLent TrainCopiedAndLent(int world, const Config& config, ToyOptions options) {
  CopiedAndLent runs;
  runs.copied = TrainOnLocalRanks(world, config, options);
  options.lend_grads = true;
  runs.lent = TrainOnLocalRanks(world, config, options);
  return runs;
}

void ExpectSameTraining(const std::vector<testing::RankRun>& lent, const std::vector<testing::RankRun>& copied) {
  ASSERT_EQ(lent.size(), copied.size());
  for (size_t r = 0; r < lent.size(); ++r) {
    EXPECT_EQ(lent[r].result.losses, copied[r].result.losses) << "rank " << r;
    EXPECT_EQ(lent[r].result.final_params, copied[r].result.final_params) << "rank " << r;
    ASSERT_EQ(lent[r].result.infos.size(), copied[r].result.infos.size());
    for (size_t s = 0; s < lent[r].result.infos.size(); ++s) {
      const float a = lent[r].result.infos[s].grad_norm, b = copied[r].result.infos[s].grad_norm;
      ASSERT_TRUE(std::isfinite(a)) << "step " << s;
      EXPECT_NEAR(a, b, 1e-6 * b) << "step " << s;  // summed per param instead of per bucket
    }
  }
}

TEST(EngineLentGrads, OneRankReadsTheTrainersGradientsAtEveryStageAndCopiesNone) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (OptimizerType type : {OptimizerType::kAdamW, OptimizerType::kLamb, OptimizerType::kSgd}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + ", optimizer " + std::to_string(static_cast<int>(type)));
      Config config = ToyConfig(stage);
      config.optimizer.type = type;
      config.optimizer.momentum = 0.9f;
      ToyOptions options;
      options.steps = 6;
      const auto [copied, lent] = TrainCopiedAndLent(1, config, options);
      ExpectSameTraining(lent, copied);
      EXPECT_EQ(lent[0].counters.grad_bytes_copied, 0);
    }
  }
}

TEST(EngineLentGrads, ClippingReadsTheLentGradientsToo) {
  for (int stage : {0, 2}) {
    Config config = ToyConfig(stage);
    config.clip_grad_norm = 0.05f;  // active on every step of the toy problem
    ToyOptions options;
    options.steps = 6;
    const auto [copied, lent] = TrainCopiedAndLent(1, config, options);
    ASSERT_EQ(lent.size(), 1u);
    ASSERT_GT(copied[0].result.infos[0].grad_norm, config.clip_grad_norm);
    for (size_t p = 0; p < lent[0].result.final_params.size(); ++p) {
      const std::vector<float>& a = lent[0].result.final_params[p];
      const std::vector<float>& b = copied[0].result.final_params[p];
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6f + 1e-5f * std::fabs(b[i])) << p << "/" << i;
    }
    EXPECT_EQ(lent[0].counters.grad_bytes_copied, 0);
  }
}

// The last micro-batch's gradient is added to the earlier ones': a copy is not all, so nothing
// is lent, and the training is the same.
TEST(EngineLentGrads, WithMicroBatchesNothingIsLent) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Config config = ToyConfig(stage);
    config.gradient_accumulation_steps = 2;
    ToyOptions options;
    options.steps = 5;
    options.micro_batches = 2;
    const auto [copied, lent] = TrainCopiedAndLent(1, config, options);
    ExpectSameTraining(lent, copied);
    EXPECT_EQ(lent[0].counters.grad_bytes_copied, 2 * ToyGradBytes(options) * options.steps);
  }
}

// The toy model's default sizes: fc1.weight (37 × 13 = 481 elements) has a bucket of its
// own, padded to 768 elements at 3 ranks, so no param fills its bucket and all are copied.
TEST(EngineLentGrads, SeveralRanksCopyWhatDoesNotFillABucket) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const Config config = ToyConfig(stage);
    ToyOptions options;
    options.steps = 4;
    const auto [copied, lent] = TrainCopiedAndLent(3, config, options);
    ExpectSameTraining(lent, copied);
    for (const testing::RankRun& run : lent) EXPECT_EQ(run.counters.grad_bytes_copied, ToyGradBytes(options) * options.steps);
  }
}

// fc1.weight sized to fill a bucket of its own exactly (hidden × 16 elements, a multiple of
// world × 128, alone since it does not fit beside its bias): at stages 0-2 its bucket's
// collective reads the lent gradient in place of the bucket, bit for bit as the copy, and
// only the other params are copied. At stage 3 a bucket is a unit (fc1's weight and bias), so
// everything is copied. The other world size pads the same weight: copied there too.
TEST(EngineLentGrads, SeveralRanksReduceAParamThatFillsItsBucketWhereItIs) {
  for (const auto& [world, hidden, padded_world] : {std::tuple{2, 16, 3}, std::tuple{3, 24, 2}}) {
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", stage " + std::to_string(stage));
      const Config config = ToyConfig(stage);
      ToyOptions options;
      options.steps = 4;
      options.inputs = 16;
      options.hidden = hidden;
      options.global_batch = 6;
      const int64_t weight_bytes = 4 * int64_t{hidden} * options.inputs;
      const int64_t copied_per_step = ToyGradBytes(options) - (stage == 3 ? 0 : weight_bytes);
      const auto [copied, lent] = TrainCopiedAndLent(world, config, options);
      ExpectSameTraining(lent, copied);
      for (const testing::RankRun& run : lent) EXPECT_EQ(run.counters.grad_bytes_copied, copied_per_step * options.steps);
      const auto [copied_padded, lent_padded] = TrainCopiedAndLent(padded_world, config, options);
      ExpectSameTraining(lent_padded, copied_padded);
      for (const testing::RankRun& run : lent_padded) {
        EXPECT_EQ(run.counters.grad_bytes_copied, ToyGradBytes(options) * options.steps);
      }
    }
  }
}

// One param; a lent gradient, then a second one for the same param in the same backward, copied
// or lent (a second lend is refused, and the gradient added to the first by a copy)
// (guard.on_duplicate = "count"): the step sees their sum. On one rank 11 elements; on two
// 256, which fill the param's bucket, so its reduction would read the lent gradient.
TEST(EngineLentGrads, ASecondGradientAddsToTheLentOne) {
  for (const auto& [world, numel] : {std::pair{1, 11}, std::pair{2, 256}}) {
    for (int stage : {0, 2}) {
      for (bool second_lent : {false, true}) {  // the second handed over by AccumulateGrad, or LendGrad
        SCOPED_TRACE("world " + std::to_string(world) + ", stage " + std::to_string(stage) +
                     (second_lent ? ", lent twice" : ""));
        const std::vector<Status> results = RunOnRanks(world, [stage, numel = numel, second_lent](int, comm::Communicator& comm) -> Status {
          Config config = ToyConfig(stage);
          config.guard.on_duplicate = DuplicatePolicy::kCount;
          config.optimizer.type = OptimizerType::kSgd;
          config.optimizer.lr = 1.0f;
          config.optimizer.weight_decay = 0.0f;
          config.buckets.first_bucket_elems = numel;
          ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, comm));
          ZERO_ASSIGN_OR_RETURN(ParamId id, engine->RegisterParam({"w", {numel}, DType::kFP32}));
          ZERO_RETURN_IF_ERROR(engine->Finalize());
          std::vector<float> w(numel, 0.0f), a(numel), b(numel), out(numel);
          for (int i = 0; i < numel; ++i) {
            a[i] = 0.5f + i % 17;
            b[i] = 0.25f * (i % 13) - 1.0f;
          }
          ZERO_RETURN_IF_ERROR(engine->SetParam(id, w.data()));
          ZERO_RETURN_IF_ERROR(engine->BeginIteration());
          ZERO_ASSIGN_OR_RETURN(bool kept, engine->LendGrad(id, a.data(), Placement::kHost));
          EXPECT_TRUE(kept);
          if (second_lent) {
            ZERO_ASSIGN_OR_RETURN(bool kept_again, engine->LendGrad(id, b.data(), Placement::kHost));
            EXPECT_FALSE(kept_again) << "copied and added: the first is lent already";
          } else {
            ZERO_RETURN_IF_ERROR(engine->AccumulateGrad(id, b.data()));
          }
          ZERO_RETURN_IF_ERROR(engine->EndBackward());
          ZERO_RETURN_IF_ERROR(engine->Step().status());
          ZERO_RETURN_IF_ERROR(engine->GetParam(id, out.data()));
          for (int i = 0; i < numel; ++i) EXPECT_EQ(out[i], -(a[i] + b[i])) << i;  // SGD, lr 1, same on every rank
          EXPECT_EQ(engine->counters().grad_bytes_copied, numel * 4);
          return absl::OkStatus();
        });
        EXPECT_THAT(results, ::testing::Each(IsOk()));
      }
    }
  }
}

// A gradient lent in one step is forgotten with it: in the next step, where the param gets
// no gradient (guard.on_unused = "zero"), neither the norm nor the optimizer reads the first
// step's memory again (poisoned here once the step returned).
TEST(EngineLentGrads, TheNextStepForgetsTheLentGradient) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::vector<Status> results = RunOnRanks(1, [stage](int, comm::Communicator& comm) -> Status {
      Config config = ToyConfig(stage);
      config.optimizer.type = OptimizerType::kSgd;
      config.optimizer.lr = 1.0f;
      config.optimizer.weight_decay = 0.0f;
      config.guard.on_unused = UnusedPolicy::kZero;
      ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, comm));
      ZERO_ASSIGN_OR_RETURN(ParamId w, engine->RegisterParam({"w", {13}, DType::kFP32, true, 0, 0}));
      ZERO_ASSIGN_OR_RETURN(ParamId v, engine->RegisterParam({"v", {5}, DType::kFP32, true, 0, 0}));
      ZERO_RETURN_IF_ERROR(engine->Finalize());
      std::vector<float> ones(13, 1.0f), a(13), b(5, 0.5f), c(5, -0.25f), out_w(13), out_v(5);
      for (int i = 0; i < 13; ++i) a[i] = 0.5f + i;
      ZERO_RETURN_IF_ERROR(engine->SetParam(w, ones.data()));
      ZERO_RETURN_IF_ERROR(engine->SetParam(v, ones.data()));
      float norm = 0.0f;
      for (int step = 0; step < 2; ++step) {
        if (stage == 3) ZERO_RETURN_IF_ERROR(engine->Gather(0));
        ZERO_RETURN_IF_ERROR(engine->BeginIteration());
        ZERO_RETURN_IF_ERROR(engine->AccumulateGrad(v, (step == 0 ? b : c).data()));
        if (step == 0) {
          ZERO_ASSIGN_OR_RETURN(bool kept, engine->LendGrad(w, a.data(), Placement::kHost));
          EXPECT_TRUE(kept);
        }
        if (stage == 3) ZERO_RETURN_IF_ERROR(engine->Release(0));
        ZERO_RETURN_IF_ERROR(engine->EndBackward());
        ZERO_ASSIGN_OR_RETURN(StepInfo info, engine->Step());
        norm = info.grad_norm;
        if (step == 0) std::fill(a.begin(), a.end(), std::nanf(""));
      }
      EXPECT_FLOAT_EQ(norm, 0.25f * std::sqrt(5.0f));  // the second step's: v's gradient alone
      ZERO_RETURN_IF_ERROR(engine->GetParam(w, out_w.data()));
      ZERO_RETURN_IF_ERROR(engine->GetParam(v, out_v.data()));
      for (int i = 0; i < 13; ++i) EXPECT_EQ(out_w[i], 1.0f - (0.5f + i)) << i;  // untouched by step 2
      for (int i = 0; i < 5; ++i) EXPECT_EQ(out_v[i], 1.0f - 0.5f + 0.25f) << i;
      return absl::OkStatus();
    });
    EXPECT_THAT(results, ::testing::Each(IsOk()));
  }
}

// Stage 2 on 3 ranks with one bucket buffer: three params, each filling its own bucket, lent
// in backward order. Their reductions read the lent gradients, so they take no buffer and
// nothing waits for one (before, each lend took the one buffer and the next waited for its
// reduction); the params end as with copied gradients, bit for bit.
TEST(EngineLentGrads, SeveralRanksLendWithoutTakingABucketBuffer) {
  constexpr int kWorld = 3, kParams = 3, kNumel = 384;  // a multiple of 3 ranks × 128 elements
  std::vector<float> copied_final;
  for (bool lend : {false, true}) {
    SCOPED_TRACE(lend ? "lent" : "copied");
    std::vector<std::vector<float>> finals(kWorld);
    std::vector<EngineCounters> counters(kWorld);
    const std::vector<Status> results = RunOnRanks(kWorld, [&](int rank, comm::Communicator& comm) -> Status {
      Config config = ToyConfig(2);
      config.optimizer.type = OptimizerType::kSgd;
      config.optimizer.lr = 1.0f;
      config.optimizer.weight_decay = 0.0f;
      config.buckets.first_bucket_elems = config.buckets.reduce_bucket_elems = kNumel;
      config.buckets.last_bucket_elems = kNumel;
      config.buckets.pool_buffers = 1;
      ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, comm));
      std::vector<ParamId> ids;
      for (int p = 0; p < kParams; ++p) {
        ZERO_ASSIGN_OR_RETURN(ParamId id, engine->RegisterParam({"w" + std::to_string(p), {kNumel}, DType::kFP32}));
        ids.push_back(id);
      }
      ZERO_RETURN_IF_ERROR(engine->Finalize());
      const std::vector<float> zeros(kNumel, 0.0f);
      for (ParamId id : ids) ZERO_RETURN_IF_ERROR(engine->SetParam(id, zeros.data()));
      std::vector<std::vector<float>> grads(kParams, std::vector<float>(kNumel));
      for (int p = 0; p < kParams; ++p) {
        for (int i = 0; i < kNumel; ++i) grads[p][i] = 0.125f * ((i * 7 + p * 5 + rank * 3) % 19) - 1.0f;
      }
      ZERO_RETURN_IF_ERROR(engine->BeginIteration());
      for (int p = kParams - 1; p >= 0; --p) {
        if (lend) {
          ZERO_ASSIGN_OR_RETURN(bool kept, engine->LendGrad(ids[p], grads[p].data(), Placement::kHost));
          EXPECT_TRUE(kept) << p;
        } else {
          ZERO_RETURN_IF_ERROR(engine->AccumulateGrad(ids[p], grads[p].data()));
        }
      }
      ZERO_RETURN_IF_ERROR(engine->EndBackward());
      ZERO_RETURN_IF_ERROR(engine->Step().status());
      for (int p = 0; p < kParams; ++p) {
        std::vector<float> out(kNumel);
        ZERO_RETURN_IF_ERROR(engine->GetParam(ids[p], out.data()));
        finals[rank].insert(finals[rank].end(), out.begin(), out.end());
      }
      counters[rank] = engine->counters();
      return absl::OkStatus();
    });
    ASSERT_THAT(results, ::testing::Each(IsOk()));
    for (int rank = 0; rank < kWorld; ++rank) {
      for (int p = 0; p < kParams; ++p) {
        for (int i = 0; i < kNumel; i += 37) {  // SGD, lr 1, from 0: minus the mean gradient
          float sum = 0.0f;
          for (int r = 0; r < kWorld; ++r) sum += 0.125f * ((i * 7 + p * 5 + r * 3) % 19) - 1.0f;
          EXPECT_FLOAT_EQ(finals[rank][p * kNumel + i], -sum / kWorld) << rank << " " << p << " " << i;
        }
      }
      EXPECT_EQ(finals[rank], finals[0]) << rank;
      if (lend) {
        EXPECT_EQ(finals[rank], copied_final) << rank;
        EXPECT_EQ(counters[rank].pool_waits, 0) << rank;
        EXPECT_EQ(counters[rank].grad_bytes_copied, 0) << rank;
      }
    }
    if (!lend) copied_final = finals[0];
  }
}

}  // namespace
}  // namespace zero
