// The engine at stages 0-2 on in-process ranks: the stage equivalence test (bit-identical loss
// trajectories across stages at every world size, matching a float64 single-process AdamW),
// overlap of reductions with backward, memory against DESIGN.md's table, gradient
// accumulation, loss scaling, clipping, and calls out of order.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <thread>

#include "zero/communicator.h"
#include "tests/engine/toy_trainer.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::ReferenceLosses;
using testing::ToyConfig;
using testing::ToyOptions;
using testing::ToyResult;
using testing::TrainToy;

struct RankRun {
  ToyResult result;
  MemoryStats memory;
  EngineCounters counters;
};

// Trains the toy model on `world` in-process ranks; returns each rank's run.
std::vector<RankRun> TrainOnLocalRanks(int world, const Config& config, const ToyOptions& options) {
  auto group = comm::CreateLocalGroup(world);
  EXPECT_TRUE(group.ok());
  std::vector<RankRun> runs(world);
  std::vector<Status> statuses(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto engine = Engine::Create(config, *(*group)[r]);
      if (!engine.ok()) {
        statuses[r] = engine.status();
        return;
      }
      statuses[r] = TrainToy(**engine, options, &runs[r].result);
      runs[r].memory = (*engine)->GetMemoryStats();
      runs[r].counters = (*engine)->counters();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  return runs;
}

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

// DESIGN.md's per-rank table with 2-byte params/grads and K = 12 (bf16 + fp32 master/m/v):
// stage 1: (2 + 2)Ψ + 12Ψ/N; stage 2: 2Ψ + (2 + 12)Ψ/N plus the declared bucket buffers.
TEST(EngineMemory, MatchesTheZeroPaperTableWithinTwoPercent) {
  constexpr int kWorld = 4;
  const std::vector<int64_t> layer = {1024, 1024};  // 8 layers ≈ 8.4M params
  for (int stage : {1, 2}) {
    Config config = ToyConfig(stage);
    config.precision.param = config.precision.grad = config.precision.reduce = DType::kBF16;
    config.buckets.first_bucket_elems = config.buckets.reduce_bucket_elems = 2'200'000;
    config.buckets.pool_buffers = 2;
    auto group = comm::CreateLocalGroup(kWorld);
    std::vector<MemoryStats> stats(kWorld);
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r) {
      ranks.emplace_back([&, r] {
        auto engine = Engine::Create(config, *(*group)[r]);
        ASSERT_TRUE(engine.ok());
        for (int l = 0; l < 8; ++l) {
          ASSERT_TRUE((*engine)->RegisterParam({"layer" + std::to_string(l), layer, DType::kBF16}).ok());
        }
        ASSERT_TRUE((*engine)->Finalize().ok());
        stats[r] = (*engine)->GetMemoryStats();
      });
    }
    for (auto& t : ranks) t.join();
    const double psi = 8.0 * 1024 * 1024, n = kWorld;
    const MemoryStats& m = stats[0];
    const double params = m.Current(MemoryCategory::kParams), grads = m.Current(MemoryCategory::kGrads),
                 optimizer = m.Current(MemoryCategory::kOptimizer);
    EXPECT_NEAR(params, 2 * psi, 0.02 * 2 * psi) << "stage " << stage;
    EXPECT_NEAR(optimizer, 12 * psi / n, 0.02 * 12 * psi / n) << "stage " << stage;
    const double want_grads = stage == 1 ? 2 * psi : 2 * psi / n;
    EXPECT_NEAR(grads, want_grads, 0.02 * want_grads) << "stage " << stage;
    const double model_states = params + grads + optimizer;
    const double table = stage == 1 ? 4 * psi + 12 * psi / n : 2 * psi + 14 * psi / n;
    EXPECT_NEAR(model_states, table, 0.02 * table) << "stage " << stage;
    const double pool = m.Current(MemoryCategory::kCommBuffers);
    if (stage == 2) {
      EXPECT_NEAR(pool, 2.0 * 2 * 2'097'152, 0.02 * pool) << "two buffers of the largest bucket";
    } else {
      EXPECT_EQ(pool, 0);
    }
  }
}

// Stage 3: (2 + 2 + 12)Ψ/N per rank for bf16 params with fp32 master/m/v, plus the gathered
// window (at most max_live_elems) and the bucket buffers.
TEST(EngineStage3, MemoryMatchesTheTableAndTheLiveWindowIsBounded) {
  constexpr int kWorld = 4, kLayers = 8;
  const int64_t layer = 1024 * 1024;
  Config config = ToyConfig(3);
  config.precision.param = config.precision.grad = config.precision.reduce = DType::kBF16;
  config.stage3.max_live_elems = 3 * layer;  // three units at a time
  config.buckets.pool_buffers = 2;
  auto group = comm::CreateLocalGroup(kWorld);
  std::vector<MemoryStats> stats(kWorld);
  std::vector<Status> results(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      results[r] = [&]() -> Status {
        ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(config, *(*group)[r]));
        for (int l = 0; l < kLayers; ++l) {
          ZERO_RETURN_IF_ERROR(e->RegisterParam({"layer" + std::to_string(l), {1024, 1024}, DType::kBF16, true, 0, l}).status());
        }
        ZERO_RETURN_IF_ERROR(e->Finalize());
        std::vector<uint16_t> grad(layer, 0);
        for (int step = 0; step < 2; ++step) {
          ZERO_RETURN_IF_ERROR(e->BeginIteration());
          for (int l = 0; l < kLayers; ++l) {  // forward: a sliding window of gathered layers
            ZERO_RETURN_IF_ERROR(e->Gather(l));
            if (l >= 2) ZERO_RETURN_IF_ERROR(e->Release(l - 2));
          }
          ZERO_RETURN_IF_ERROR(e->Release(kLayers - 2));
          ZERO_RETURN_IF_ERROR(e->Release(kLayers - 1));
          for (int l = kLayers - 1; l >= 0; --l) {  // backward
            ZERO_RETURN_IF_ERROR(e->Gather(l));
            ZERO_RETURN_IF_ERROR(e->AccumulateGrad(l, grad.data()));
            ZERO_RETURN_IF_ERROR(e->Release(l));
          }
          ZERO_RETURN_IF_ERROR(e->EndBackward());
          ZERO_RETURN_IF_ERROR(e->Step().status());
        }
        // A fourth unit beyond max_live_elems is refused clearly, not over-allocated.
        ZERO_RETURN_IF_ERROR(e->Gather(0));
        ZERO_RETURN_IF_ERROR(e->Gather(1));
        ZERO_RETURN_IF_ERROR(e->Gather(2));
        const Status over = e->Gather(3);
        if (!absl::IsResourceExhausted(over) || over.message().find("max_live_elems") == std::string::npos) {
          return absl::InternalError(absl::StrCat("expected ResourceExhausted naming max_live_elems, got ", over.ToString()));
        }
        stats[r] = e->GetMemoryStats();
        return absl::OkStatus();
      }();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(results[r].ok()) << results[r];
  const double psi = double(kLayers) * layer, n = kWorld;
  const MemoryStats& m = stats[0];
  const double states = m.Peak(MemoryCategory::kParams) + m.Peak(MemoryCategory::kGrads) + m.Peak(MemoryCategory::kOptimizer);
  EXPECT_NEAR(states, 16 * psi / n, 0.02 * 16 * psi / n);
  EXPECT_LE(m.Peak(MemoryCategory::kGathered), 3 * layer * 2) << "the gathered window exceeded max_live_elems";
  EXPECT_GE(m.Peak(MemoryCategory::kGathered), 2 * layer * 2);
}

TEST(EngineStage3, PrefetchStartsTheNextUnitsGatherBeforeTheTrainerAsks) {
  ToyOptions options;
  options.steps = 5;
  const auto runs = TrainOnLocalRanks(2, ToyConfig(3), options);
  if (HasFailure()) return;
  // Iteration 1 records the order; from iteration 2 on the next unit is already on its way.
  EXPECT_GT(runs[0].counters.gathers_prefetched, 0);
  EXPECT_EQ(runs[0].counters.trace_invalidations, 0);
  Config no_prefetch = ToyConfig(3);
  no_prefetch.stage3.prefetch_elems = 0;
  const auto on_demand = TrainOnLocalRanks(2, no_prefetch, options);
  EXPECT_EQ(on_demand[0].counters.gathers_prefetched, 0);
  EXPECT_EQ(on_demand[0].result.losses, runs[0].result.losses);
}

TEST(EngineStage3, ChangedControlFlowDropsTheTraceAndStaysCorrect) {
  ToyOptions options;
  options.steps = 8;
  options.skip_unit0_on_odd_steps = true;  // data-dependent: some iterations skip a unit
  const auto reference = TrainOnLocalRanks(3, ToyConfig(0), options);
  const auto runs = TrainOnLocalRanks(3, ToyConfig(3), options);
  if (HasFailure()) return;
  EXPECT_GE(runs[0].counters.trace_invalidations, 1);
  EXPECT_EQ(runs[0].result.losses, reference[0].result.losses);
  EXPECT_EQ(runs[0].result.final_params, reference[0].result.final_params);
}

TEST(EngineStage3, ViewsOfUngatheredParamsAreErrors) {
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(ToyConfig(3), *(*group)[0]);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  const ParamId a = *e.RegisterParam({"a", {300}, DType::kFP32, true, 0, 5});
  ASSERT_TRUE(e.Finalize().ok());
  std::vector<float> values(300, 2.0f), out(300);
  ASSERT_TRUE(e.SetParam(a, values.data()).ok());
  const Status view = e.ParamData(a).status();
  EXPECT_EQ(view.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(view.message().find("Gather(5)"), std::string::npos) << view;
  ASSERT_TRUE(e.GetParam(a, out.data()).ok());  // gathers for the call
  EXPECT_EQ(out, values);
  ASSERT_TRUE(e.Gather(5).ok());
  EXPECT_EQ(static_cast<float*>(*e.ParamData(a))[299], 2.0f);
  ASSERT_TRUE(e.Release(5).ok());
  EXPECT_EQ(e.ParamData(a).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.Release(5).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.Gather(9).code(), absl::StatusCode::kNotFound);
}

TEST(EngineStep, LossScalingSkipsOverflowAndClippingBoundsTheNorm) {
  auto group = comm::CreateLocalGroup(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      Config config = ToyConfig(2);
      config.loss_scale.mode = LossScaleMode::kDynamic;
      config.loss_scale.initial_power = 4;
      config.loss_scale.hysteresis = 1;
      config.clip_grad_norm = 0.5f;
      auto engine = Engine::Create(config, *(*group)[r]);
      ASSERT_TRUE(engine.ok());
      const ParamId id = *(*engine)->RegisterParam({"w", {1000}});
      ASSERT_TRUE((*engine)->Finalize().ok());
      std::vector<float> init(1000, 1.0f), after(1000);
      ASSERT_TRUE((*engine)->SetParam(id, init.data()).ok());
      // Step 1: rank 1 has an Inf → skipped everywhere, scale halves, params untouched.
      std::vector<float> grad(1000, 16.0f);  // 16 × scale 16 … unscaled 1.0 per element
      if (r == 1) grad[999] = INFINITY;
      ASSERT_TRUE((*engine)->BeginIteration().ok());
      ASSERT_TRUE((*engine)->AccumulateGrad(id, grad.data()).ok());
      ASSERT_TRUE((*engine)->EndBackward().ok());
      auto info = (*engine)->Step();
      ASSERT_TRUE(info.ok());
      EXPECT_TRUE(info->skipped);
      EXPECT_EQ(info->loss_scale, 8.0f);
      ASSERT_TRUE((*engine)->GetParam(id, after.data()).ok());
      EXPECT_EQ(after, init);
      // Step 2: finite. Unscaled averaged gradient = 1 everywhere: norm sqrt(1000) ≈ 31.6 > 0.5.
      std::fill(grad.begin(), grad.end(), 8.0f);
      ASSERT_TRUE((*engine)->BeginIteration().ok());
      ASSERT_TRUE((*engine)->AccumulateGrad(id, grad.data()).ok());
      ASSERT_TRUE((*engine)->EndBackward().ok());
      info = (*engine)->Step();
      ASSERT_TRUE(info.ok());
      EXPECT_FALSE(info->skipped);
      EXPECT_EQ(info->step, 1);
      EXPECT_NEAR(info->grad_norm, std::sqrt(1000.0f), 1e-3);
      ASSERT_TRUE((*engine)->GetParam(id, after.data()).ok());
      EXPECT_NE(after, init);
    });
  }
  for (auto& t : ranks) t.join();
}

TEST(EngineProtocol, CallsOutOfOrderAreClearErrorsAndLoseNothing) {
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(ToyConfig(2), *(*group)[0]);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  EXPECT_EQ(e.Step().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.BeginIteration().code(), absl::StatusCode::kFailedPrecondition);
  const ParamId a = *e.RegisterParam({"a", {10}});
  const ParamId b = *e.RegisterParam({"b", {3, 3}});
  EXPECT_EQ(e.RegisterParam({"a", {4}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.RegisterParam({"bad", {0}}).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(e.Finalize().ok());
  EXPECT_EQ(e.RegisterParam({"late", {4}}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.GradReady(a).code(), absl::StatusCode::kFailedPrecondition);  // before BeginIteration
  EXPECT_EQ(e.Step().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e.BeginIteration().ok());
  EXPECT_EQ(e.GradReady(99).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(e.GradReady(a).ok());
  const Status twice = e.GradReady(a);
  EXPECT_TRUE(IsDuplicateGradient(twice)) << twice;
  EXPECT_NE(twice.message().find("\"a\""), std::string::npos) << twice;
  const Status begun = e.BeginIteration();
  EXPECT_EQ(begun.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(begun.message().find("\"b\""), std::string::npos) << begun;  // the param it waits for
  const Status unused = e.EndBackward();
  EXPECT_TRUE(IsUnusedParameters(unused)) << unused;
  EXPECT_NE(unused.message().find("\"b\" (index 1)"), std::string::npos) << unused;
  // Recoverable: mark the missing param and finish.
  ASSERT_TRUE(e.GradReady(b).ok());
  ASSERT_TRUE(e.EndBackward().ok());
  EXPECT_TRUE(e.Step().ok());
}

TEST(EngineProtocol, SetStreamIsForCudaEnginesAndOutsideIterations) {
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(ToyConfig(1), *(*group)[0]);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  ASSERT_TRUE(e.RegisterParam({"a", {4}}).ok());
  ASSERT_TRUE(e.Finalize().ok());
  EXPECT_TRUE(e.SetStream(nullptr).ok());
  int not_a_stream = 0;
  const Status cpu = e.SetStream(&not_a_stream);
  EXPECT_EQ(cpu.code(), absl::StatusCode::kInvalidArgument) << cpu;
  EXPECT_NE(cpu.message().find("\"cuda\""), std::string::npos) << cpu;
  ASSERT_TRUE(e.BeginIteration().ok());
  EXPECT_EQ(e.SetStream(nullptr).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EngineConfig, JsonRoundTripAndErrorsNameTheKey) {
  auto config = Config::FromJson(R"({"stage": 1, "optimizer": {"type": "sgd", "lr": 0.1,
      "momentum": 0.9}, "buckets": {"reduce_bucket_elems": 1000}, "guard": {"timeout_s": 5}})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->stage, 1);
  EXPECT_EQ(config->optimizer.type, OptimizerType::kSgd);
  EXPECT_FLOAT_EQ(config->optimizer.momentum, 0.9f);
  EXPECT_EQ(config->buckets.reduce_bucket_elems, 1000);
  auto unknown = Config::FromJson(R"({"buckets": {"reduce_bucket_size": 5}})");
  EXPECT_NE(unknown.status().message().find("buckets.reduce_bucket_size"), std::string::npos) << unknown.status();
  auto range = Config::FromJson(R"({"stage": 5})");
  EXPECT_NE(range.status().message().find("\"stage\""), std::string::npos) << range.status();
  auto type = Config::FromJson(R"({"optimizer": {"lr": "fast"}})");
  EXPECT_NE(type.status().message().find("optimizer.lr"), std::string::npos) << type.status();
  auto choice = Config::FromJson(R"({"optimizer": {"type": "adagrad"}})");
  EXPECT_NE(choice.status().message().find("adagrad"), std::string::npos) << choice.status();
  EXPECT_FALSE(Config::FromJson("{not json").ok());
}

}  // namespace
}  // namespace zero
