// Stage 3 on in-process ranks: memory against the table with a bounded gathered window,
// prefetch along the recorded order, a changed control flow that drops the trace and stays
// correct, views of params whose unit is not gathered, and releasing the cached units.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include <cmath>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::RunOnRanks;
using testing::StatusIs;
using testing::ToyConfig;
using testing::ToyOptions;
using testing::TrainOnLocalRanks;

// Stage 3: (2 + 2 + 12)Ψ/N per rank for bf16 params with fp32 master/m/v, plus the gathered
// window (at most max_live_elems) and the bucket buffers.
TEST(EngineStage3, MemoryMatchesTheTableAndTheLiveWindowIsBounded) {
  constexpr int kWorld = 4, kLayers = 8;
  const int64_t layer = 1024 * 1024;
  Config config = ToyConfig(3);
  config.precision.param = config.precision.grad = config.precision.reduce = DType::kBF16;
  config.stage3.max_live_elems = 3 * layer;  // three units at a time
  config.buckets.pool_buffers = 2;
  std::vector<MemoryStats> stats(kWorld);
  const std::vector<Status> results = RunOnRanks(kWorld, [&](int r, comm::Communicator& comm) -> Status {
        ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(config, comm));
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
        stats[r] = e->GetMemoryStats();
        // A fourth unit the trainer asks for beyond max_live_elems is gathered anyway, as
        // DeepSpeed's stage3_max_live_parameters (the limit bounds keeping and prefetching).
        for (int l = 0; l < 4; ++l) ZERO_RETURN_IF_ERROR(e->Gather(l));
        if (e->GetMemoryStats().Current(MemoryCategory::kGathered) < 4 * layer * 2) {
          return absl::InternalError("four gathered units do not hold four units' memory");
        }
        return absl::OkStatus();
  });
  ASSERT_THAT(results, ::testing::Each(IsOk()));
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

// An eval pass between steps (forward gathers only) follows the recorded order's first
// gathers; the training step after it starts from the top again (its first gather is the
// trace's first), so prefetching goes on in it and after it, without recording again. (It
// used to stop for good; then to pause for two steps while the order was recorded again.)
TEST(EngineStage3, PrefetchResumesAfterAnEvalPass) {
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(ToyConfig(3), *(*group)[0]);
  ASSERT_THAT(engine, IsOk());
  Engine& e = **engine;
  constexpr int kUnits = 3;
  for (int u = 0; u < kUnits; ++u) ASSERT_THAT(e.RegisterParam({"p" + std::to_string(u), {500}, DType::kFP32, true, 0, u}), IsOk());
  ASSERT_THAT(e.Finalize(), IsOk());
  const std::vector<float> grad(500, 0.01f);
  auto train_step = [&] {
    for (int u = 0; u < kUnits; ++u) {  // forward
      ASSERT_THAT(e.Gather(u), IsOk());
      ASSERT_THAT(e.Release(u), IsOk());
    }
    ASSERT_THAT(e.BeginIteration(), IsOk());
    for (int u = kUnits - 1; u >= 0; --u) {  // backward
      ASSERT_THAT(e.Gather(u), IsOk());
      ASSERT_THAT(e.AccumulateGrad(u, grad.data()), IsOk());
      ASSERT_THAT(e.Release(u), IsOk());
    }
    ASSERT_THAT(e.EndBackward(), IsOk());
    ASSERT_THAT(e.Step(), IsOk());
  };
  for (int step = 0; step < 2; ++step) train_step();
  const int64_t before_steady = e.counters().gathers_prefetched;
  train_step();
  const int64_t per_step = e.counters().gathers_prefetched - before_steady;  // prefetched per step
  ASSERT_GT(per_step, 0);
  for (int u = 0; u < kUnits; ++u) {  // the eval pass: forward only
    ASSERT_THAT(e.Gather(u), IsOk());
    ASSERT_THAT(e.Release(u), IsOk());
  }
  const int64_t prefetched = e.counters().gathers_prefetched;
  train_step();  // back at the trace's first gather
  EXPECT_GE(e.counters().gathers_prefetched - prefetched, per_step) << "prefetching stopped after the eval pass";
  const int64_t after_eval = e.counters().gathers_prefetched;
  train_step();
  train_step();
  EXPECT_EQ(e.counters().gathers_prefetched - after_eval, 2 * per_step) << "prefetching did not go on";
  EXPECT_EQ(e.counters().trace_invalidations, 0);
}

// A unit a forward releases until its backward where the recorded order gathers it again
// before stage3.max_reuse_elems elements of other units stays gathered (ReleaseUntilBackward
// keeps it, as DeepSpeed's stage3_max_reuse_distance does): unit u's backward gather comes
// 2 × (3 - u) units after its forward's, so the default distance keeps every unit, whatever
// the prefetch window (which bounds gathers ahead of the trainer, not kept units), whether the
// forward runs inside the iteration or before BeginIteration (as PyTorch's hooks do); shorter
// distances keep the units that come back sooner, 0 keeps none, and a plain Release keeps
// nothing. The gathered memory stays within the kept units and the window, and the training
// is the same in all of them.
TEST(EngineStage3, AReleasedUnitGatheredAgainWithinTheReuseDistanceStaysGathered) {
  constexpr int kWorld = 3, kUnits = 4, kSteps = 4;
  constexpr int64_t kUnitElems = 768;  // 700 elements padded to a multiple of 3 × 128
  struct Run {
    int64_t kept_last_step = 0;
    int64_t on_demand_last_step = 0;
    int64_t peak_gathered = 0;
    std::vector<float> params;
  };
  enum class Forward { kInsideIteration, kBeforeIteration, kPlainRelease };
  auto train = [&](int64_t prefetch_elems, Forward forward = Forward::kInsideIteration,
                   int64_t max_reuse_elems = Stage3Config().max_reuse_elems,
                   int64_t max_live_elems = Stage3Config().max_live_elems) {
    const bool before = forward == Forward::kBeforeIteration;
    std::vector<Run> runs(kWorld);
    Config config = ToyConfig(3);
    config.stage3.prefetch_elems = prefetch_elems;
    config.stage3.max_reuse_elems = max_reuse_elems;
    config.stage3.max_live_elems = max_live_elems;
    const std::vector<Status> results = RunOnRanks(kWorld, [&](int r, comm::Communicator& comm) -> Status {
      ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(config, comm));
      for (int u = 0; u < kUnits; ++u) {
        ZERO_RETURN_IF_ERROR(e->RegisterParam({"p" + std::to_string(u), {700}, DType::kFP32, true, 0, u}).status());
      }
      ZERO_RETURN_IF_ERROR(e->Finalize());
      std::vector<float> grad(700);
      for (int step = 0; step < kSteps; ++step) {
        const int64_t kept_before = e->counters().releases_kept;
        const int64_t on_demand_before = e->counters().gathers_on_demand;
        if (!before) ZERO_RETURN_IF_ERROR(e->BeginIteration());
        for (int u = 0; u < kUnits; ++u) {  // forward
          ZERO_RETURN_IF_ERROR(e->Gather(u));
          ZERO_RETURN_IF_ERROR(forward == Forward::kPlainRelease ? e->Release(u) : e->ReleaseUntilBackward(u));
        }
        if (before) ZERO_RETURN_IF_ERROR(e->BeginIteration());
        for (int u = kUnits - 1; u >= 0; --u) {  // backward
          ZERO_RETURN_IF_ERROR(e->Gather(u));
          ZERO_ASSIGN_OR_RETURN(void* values, e->ParamData(u));
          for (int i = 0; i < 700; ++i) grad[i] = 0.01f * (i % 7 - 3) + 0.1f * static_cast<float*>(values)[i] + 0.001f * r;
          ZERO_RETURN_IF_ERROR(e->AccumulateGrad(u, grad.data()));
          ZERO_RETURN_IF_ERROR(e->Release(u));
        }
        ZERO_RETURN_IF_ERROR(e->EndBackward());
        ZERO_RETURN_IF_ERROR(e->Step().status());
        runs[r].kept_last_step = e->counters().releases_kept - kept_before;
        runs[r].on_demand_last_step = e->counters().gathers_on_demand - on_demand_before;
      }
      runs[r].peak_gathered = e->GetMemoryStats().Peak(MemoryCategory::kGathered);
      std::vector<float> values(700);
      for (int u = 0; u < kUnits; ++u) {
        ZERO_RETURN_IF_ERROR(e->GetParam(u, values.data()));
        runs[r].params.insert(runs[r].params.end(), values.begin(), values.end());
      }
      return absl::OkStatus();
    });
    EXPECT_THAT(results, ::testing::Each(IsOk()));
    return runs;
  };
  const std::vector<Run> all = train(kUnits * kUnitElems), one = train(kUnitElems), none = train(0);
  const std::vector<Run> all_before = train(kUnits * kUnitElems, Forward::kBeforeIteration);
  const std::vector<Run> one_before = train(kUnitElems, Forward::kBeforeIteration);
  const std::vector<Run> all_plain = train(kUnits * kUnitElems, Forward::kPlainRelease);
  const std::vector<Run> reuse_two = train(kUnits * kUnitElems, Forward::kInsideIteration, 2 * kUnitElems + 1);
  const std::vector<Run> reuse_one = train(kUnits * kUnitElems, Forward::kInsideIteration, 1);
  const std::vector<Run> reuse_none = train(kUnits * kUnitElems, Forward::kInsideIteration, 0);
  const std::vector<Run> reuse_one_no_window = train(0, Forward::kInsideIteration, 1);
  const std::vector<Run> minimal = train(0, Forward::kInsideIteration, 0);
  const std::vector<Run> live_three = train(0, Forward::kInsideIteration, Stage3Config().max_reuse_elems, 3 * kUnitElems);
  const std::vector<Run> live_two = train(kUnitElems, Forward::kInsideIteration, Stage3Config().max_reuse_elems, 2 * kUnitElems);
  if (HasFailure()) return;
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(all[r].kept_last_step, kUnits);
    EXPECT_EQ(one[r].kept_last_step, kUnits) << "the prefetch window limited the kept units";
    EXPECT_EQ(none[r].kept_last_step, kUnits) << "the prefetch window limited the kept units";
    EXPECT_EQ(all_before[r].kept_last_step, kUnits) << "ReleaseUntilBackward outside an iteration";
    EXPECT_EQ(one_before[r].kept_last_step, kUnits);
    EXPECT_EQ(all_plain[r].kept_last_step, 0) << "a plain Release keeps";
    EXPECT_EQ(reuse_two[r].kept_last_step, 2) << "units 3 and 2 come back within 2 units";
    EXPECT_EQ(reuse_one[r].kept_last_step, 1) << "unit 3 comes back at once";
    EXPECT_EQ(reuse_one_no_window[r].kept_last_step, 1);
    EXPECT_EQ(reuse_none[r].kept_last_step, 0);
    EXPECT_EQ(minimal[r].kept_last_step, 0);
    EXPECT_LE(all[r].peak_gathered, kUnits * kUnitElems * 4);
    EXPECT_LE(none[r].peak_gathered, kUnits * kUnitElems * 4);
    EXPECT_LE(reuse_one_no_window[r].peak_gathered, 2 * kUnitElems * 4) << "one held, one kept";
    EXPECT_LE(minimal[r].peak_gathered, kUnitElems * 4) << "nothing kept, nothing prefetched";
    // Room for 3 units: unit 3's gather drops the kept unit needed last (unit 0), and only
    // unit 0's backward gathers again.
    EXPECT_EQ(live_three[r].kept_last_step, kUnits);
    EXPECT_EQ(live_three[r].on_demand_last_step, kUnits + 1);
    EXPECT_LE(live_three[r].peak_gathered, 3 * kUnitElems * 4);
    // Room for 2 units with a window of 1: the forward's last unit, which its backward gathers
    // first, stays gathered although no whole window fits beside it (freeing it would only
    // gather it straight back); only unit 0's forward gathers on demand.
    EXPECT_EQ(live_two[r].kept_last_step, 1);
    EXPECT_EQ(live_two[r].on_demand_last_step, 1) << "the forward's last unit was freed and gathered straight back";
    EXPECT_LE(live_two[r].peak_gathered, 2 * kUnitElems * 4);
    for (const std::vector<Run>* run : {&all, &one, &all_before, &one_before, &all_plain, &reuse_two, &reuse_one,
                                        &reuse_none, &reuse_one_no_window, &minimal, &live_three}) {
      EXPECT_EQ((*run)[r].params, none[r].params);
    }
  }
}

// A trainer may write into a gathered unit (a look at the params that changes them in place,
// between iterations or between a backward and its step); its Release frees the unit, so the
// next gather reads the shards' values again, however soon the recorded order gathers it.
TEST(EngineStage3, AWriteIntoAGatheredUnitIsDroppedAtItsRelease) {
  for (const bool inside_iteration : {false, true}) {
    SCOPED_TRACE(inside_iteration ? "inside an iteration" : "between iterations");
    const std::vector<Status> results = RunOnRanks(2, [&](int, comm::Communicator& comm) -> Status {
      ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(ToyConfig(3), comm));
      for (int u = 0; u < 2; ++u) ZERO_RETURN_IF_ERROR(e->RegisterParam({"p" + std::to_string(u), {300}, DType::kFP32, true, 0, u}).status());
      ZERO_RETURN_IF_ERROR(e->Finalize());
      const std::vector<float> grad(300, 0.5f);
      for (int step = 0; step < 3; ++step) {
        ZERO_RETURN_IF_ERROR(e->BeginIteration());
        for (int u = 0; u < 2; ++u) {
          ZERO_RETURN_IF_ERROR(e->Gather(u));
          ZERO_RETURN_IF_ERROR(e->ReleaseUntilBackward(u));
        }
        for (int u = 1; u >= 0; --u) {
          ZERO_RETURN_IF_ERROR(e->Gather(u));
          ZERO_RETURN_IF_ERROR(e->AccumulateGrad(u, grad.data()));
          ZERO_RETURN_IF_ERROR(e->Release(u));
        }
        ZERO_RETURN_IF_ERROR(e->EndBackward());
        ZERO_RETURN_IF_ERROR(e->Step().status());
      }
      std::vector<float> before(300);
      ZERO_RETURN_IF_ERROR(e->GetParam(0, before.data()));
      const int64_t kept = e->counters().releases_kept;
      EXPECT_GT(kept, 0);  // by the forwards
      if (inside_iteration) ZERO_RETURN_IF_ERROR(e->BeginIteration());
      ZERO_RETURN_IF_ERROR(e->Gather(0));  // the recorded order's first gather
      ZERO_ASSIGN_OR_RETURN(void* view, e->ParamData(0));
      std::fill_n(static_cast<float*>(view), 300, 42.0f);
      ZERO_RETURN_IF_ERROR(e->Release(0));
      EXPECT_EQ(e->counters().releases_kept, kept);
      ZERO_RETURN_IF_ERROR(e->Gather(0));
      ZERO_ASSIGN_OR_RETURN(view, e->ParamData(0));
      const float* values = static_cast<const float*>(view);
      EXPECT_EQ(std::vector<float>(values, values + 300), before);
      return e->Release(0);
    });
    EXPECT_THAT(results, ::testing::Each(IsOk()));
  }
}

TEST(EngineStage3, ViewsOfUngatheredParamsAreErrors) {
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(ToyConfig(3), *(*group)[0]);
  ASSERT_THAT(engine, IsOk());
  Engine& e = **engine;
  const ParamId a = *e.RegisterParam({"a", {300}, DType::kFP32, true, 0, 5});
  ASSERT_THAT(e.Finalize(), IsOk());
  std::vector<float> values(300, 2.0f), out(300);
  ASSERT_THAT(e.SetParam(a, values.data()), IsOk());
  EXPECT_THAT(e.ParamData(a), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("Gather(5)")));
  ASSERT_THAT(e.GetParam(a, out.data()), IsOk());  // gathers for the call
  EXPECT_EQ(out, values);
  ASSERT_THAT(e.Gather(5), IsOk());
  EXPECT_EQ(static_cast<float*>(*e.ParamData(a))[299], 2.0f);
  ASSERT_THAT(e.Release(5), IsOk());
  EXPECT_THAT(e.ParamData(a), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(e.Release(5), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("Release(5)")));
  EXPECT_THAT(e.Gather(9), StatusIs(absl::StatusCode::kNotFound, HasSubstr("Gather(9)")));
  // Errors name the call the trainer made.
  EXPECT_THAT(e.ReleaseUntilBackward(9), StatusIs(absl::StatusCode::kNotFound, HasSubstr("ReleaseUntilBackward(9)")));
  EXPECT_THAT(e.ReleaseUntilBackward(5),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("ReleaseUntilBackward(5)")));
}

// Two ranks that run different modules whose units have the same size (rank 1 gathers unit 1
// where rank 0 gathers unit 0): each gather carries its unit, so both ranks get an error naming
// both units (tags) and ranks instead of computing with each other's values.
TEST(EngineStage3, RanksGatheringDifferentUnitsOfOneSizeFail) {
  Config config = ToyConfig(3);
  config.stage3.persistence_threshold = 0;
  config.stage3.prefetch_elems = 0;
  config.guard.timeout_s = 20;
  const std::vector<Status> results = RunOnRanks(2, [&](int r, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(config, comm));
    for (int u = 0; u < 2; ++u) {
      ZERO_RETURN_IF_ERROR(e->RegisterParam({"block" + std::to_string(u) + ".weight", {256}, DType::kFP32, true, 0, u}).status());
    }
    ZERO_RETURN_IF_ERROR(e->Finalize());
    ZERO_RETURN_IF_ERROR(e->Gather(r));  // diverged: rank r runs block r
    return e->Release(r);
  });
  for (const Status& s : results) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mismatch")));
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tag=0")));
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tag=1")));
  }
}

// Ranks whose forwards reached different params (a param used on some ranks only) have its
// unit's gradients complete at different points of their backward, so they release the unit
// at different points: here rank 0 releases unit 2 before its backward gathers unit 1, rank 1
// after. A prefetch from that gather that looked past the micro-batch saw unit 2's next
// forward gather free on rank 0 and held on rank 1, and only rank 0 all-gathered it: a
// collective mismatch at the second micro-batch of the step after the recorded one.
// Prefetches stop at the end of the micro-batch.
TEST(EngineStage3, RanksReleasingAUnitAtDifferentPointsOfABackwardGatherTheSame) {
  Config config = ToyConfig(3);
  config.stage3.persistence_threshold = 0;
  config.guard.timeout_s = 20;
  constexpr int kUnits = 3, kMicroBatches = 2, kSteps = 3;
  config.gradient_accumulation_steps = kMicroBatches;
  const std::vector<float> grad(500, 0.01f);
  const std::vector<Status> results = RunOnRanks(2, [&](int r, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(config, comm));
    for (int u = 0; u < kUnits; ++u) {
      ZERO_RETURN_IF_ERROR(e->RegisterParam({"p" + std::to_string(u), {500}, DType::kFP32, true, 0, u}).status());
    }
    ZERO_RETURN_IF_ERROR(e->Finalize());
    for (int step = 0; step < kSteps; ++step) {
      for (int micro_batch = 0; micro_batch < kMicroBatches; ++micro_batch) {
        for (int u = 0; u < kUnits; ++u) {  // forward
          ZERO_RETURN_IF_ERROR(e->Gather(u));
          ZERO_RETURN_IF_ERROR(e->Release(u));
        }
        ZERO_RETURN_IF_ERROR(e->BeginIteration());
        ZERO_RETURN_IF_ERROR(e->Gather(2));  // backward
        ZERO_RETURN_IF_ERROR(e->AccumulateGrad(2, grad.data()));
        if (r == 0) ZERO_RETURN_IF_ERROR(e->Release(2));
        for (int u = 1; u >= 0; --u) {
          ZERO_RETURN_IF_ERROR(e->Gather(u));
          if (r == 1 && u == 1) ZERO_RETURN_IF_ERROR(e->Release(2));
          ZERO_RETURN_IF_ERROR(e->AccumulateGrad(u, grad.data()));
          ZERO_RETURN_IF_ERROR(e->Release(u));
        }
        ZERO_RETURN_IF_ERROR(e->EndBackward());
      }
      ZERO_RETURN_IF_ERROR(e->Step().status());
    }
    if (e->counters().gathers_prefetched == 0) return absl::InternalError("nothing was prefetched");
    return absl::OkStatus();
  });
  for (const Status& s : results) EXPECT_THAT(s, IsOk());
}

// ReleaseCachedUnits (DeepSpeed's empty_partition_cache) frees what an eval pass leaves
// gathered (the forward prefetches the backward that never comes; a plain step leaves the
// buffers Release keeps for reuse) while a unit the trainer holds stays gathered with valid
// views, on 3 ranks; the training after it equals a run without it, bit for bit. A no-op at
// stage 2.
TEST(EngineStage3, ReleasingCachedUnitsFreesWhatAnEvalPassLeftGatheredAndTrainsTheSame) {
  constexpr int kWorld = 3, kUnits = 4, kSteps = 4;
  constexpr int64_t kElems = 700;
  struct Run {
    int64_t gathered_after_eval = 0, gathered_after_release = 0, gathered_while_held = 0;
    std::vector<std::vector<float>> params;
  };
  auto train = [&](bool release_cached) {
    std::vector<Run> runs(kWorld);
    const std::vector<Status> results = RunOnRanks(kWorld, [&](int r, comm::Communicator& comm) -> Status {
      Config config = ToyConfig(3);
      config.stage3.persistence_threshold = 0;
      ZERO_ASSIGN_OR_RETURN(auto e, Engine::Create(config, comm));
      for (int u = 0; u < kUnits; ++u) {
        ZERO_RETURN_IF_ERROR(e->RegisterParam({"p" + std::to_string(u), {kElems}, DType::kFP32, true, 0, u}).status());
      }
      ZERO_RETURN_IF_ERROR(e->Finalize());
      std::vector<float> grad(kElems);
      auto eval_forward = [&]() -> Status {
        for (int u = 0; u < kUnits; ++u) {
          ZERO_RETURN_IF_ERROR(e->Gather(u));
          ZERO_RETURN_IF_ERROR(e->Release(u));
        }
        return absl::OkStatus();
      };
      for (int step = 0; step < kSteps; ++step) {
        for (int u = 0; u < kUnits; ++u) {  // forward, its backward to follow
          ZERO_RETURN_IF_ERROR(e->Gather(u));
          ZERO_RETURN_IF_ERROR(e->ReleaseUntilBackward(u));
        }
        ZERO_RETURN_IF_ERROR(e->BeginIteration());
        for (int u = kUnits - 1; u >= 0; --u) {  // backward
          ZERO_RETURN_IF_ERROR(e->Gather(u));
          for (int64_t i = 0; i < kElems; ++i) grad[i] = std::sin(0.01f * (i + 1) * (u + 1) + step + r);
          ZERO_RETURN_IF_ERROR(e->AccumulateGrad(u, grad.data()));
          ZERO_RETURN_IF_ERROR(e->Release(u));
        }
        ZERO_RETURN_IF_ERROR(e->EndBackward());
        ZERO_RETURN_IF_ERROR(e->Step().status());
        ZERO_RETURN_IF_ERROR(eval_forward());
        if (step == 1) runs[r].gathered_after_eval = e->GetMemoryStats().Current(MemoryCategory::kGathered);
        if (!release_cached) continue;
        ZERO_RETURN_IF_ERROR(e->ReleaseCachedUnits());
        if (step == 1) runs[r].gathered_after_release = e->GetMemoryStats().Current(MemoryCategory::kGathered);
        if (step != 2) continue;
        ZERO_RETURN_IF_ERROR(e->Gather(0));  // a unit held across the call stays gathered
        ZERO_RETURN_IF_ERROR(eval_forward());
        ZERO_RETURN_IF_ERROR(e->ReleaseCachedUnits());
        runs[r].gathered_while_held = e->GetMemoryStats().Current(MemoryCategory::kGathered);
        ZERO_ASSIGN_OR_RETURN(void* view, e->ParamData(0));
        std::vector<float> held(kElems), full(kElems);
        std::copy_n(static_cast<const float*>(view), kElems, held.begin());
        ZERO_RETURN_IF_ERROR(e->Release(0));
        ZERO_RETURN_IF_ERROR(e->GetParam(0, full.data()));
        if (held != full) return absl::InternalError("the held unit's view lost its values");
      }
      runs[r].params.resize(kUnits, std::vector<float>(kElems));
      for (int u = 0; u < kUnits; ++u) ZERO_RETURN_IF_ERROR(e->GetParam(u, runs[r].params[u].data()));
      return absl::OkStatus();
    });
    EXPECT_THAT(results, ::testing::Each(IsOk()));
    return runs;
  };
  const std::vector<Run> released = train(true), kept = train(false);
  if (HasFailure()) return;
  const int64_t unit_bytes = 768 * 4;  // 700 elements padded to a multiple of 3 × 128
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_GT(released[r].gathered_after_eval, 0) << "the eval pass left nothing gathered to free";
    EXPECT_EQ(released[r].gathered_after_release, 0) << "rank " << r;
    EXPECT_EQ(released[r].gathered_while_held, unit_bytes) << "rank " << r << ": only the held unit stays";
    EXPECT_EQ(released[r].params, kept[r].params) << "rank " << r << " trained differently";
  }
  auto group = comm::CreateLocalGroup(1);
  auto stage2 = Engine::Create(ToyConfig(2), *(*group)[0]);
  ASSERT_THAT(stage2, IsOk());
  ASSERT_THAT((*stage2)->RegisterParam({"w", {kElems}, DType::kFP32, true}), IsOk());
  ASSERT_THAT((*stage2)->Finalize(), IsOk());
  EXPECT_THAT((*stage2)->ReleaseCachedUnits(), IsOk());
}

}  // namespace
}  // namespace zero
