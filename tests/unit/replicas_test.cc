// Replicas that cannot drift: ranks that set different initial params get rank 0's values at
// the first iteration (guard.init_params = "broadcast") or a clear error ("verify", and always
// at stage 3); guard.replica_check_every catches replicas that drift later.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::Each;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

constexpr int kWorld = 3;

// Runs body(rank, engine) on kWorld in-process ranks, each with a finalized engine holding
// "w" [5, 7] and "b" [7] (unit 0), and returns each rank's status.
std::vector<Status> OnRanks(const Config& config, const std::function<Status(int, Engine&)>& body) {
  return testing::RunOnRanks(kWorld, [&](int r, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
    for (const ParamSpec& spec : {ParamSpec{"w", {5, 7}, DType::kFP32, true, 0, 0},
                                  ParamSpec{"b", {7}, DType::kFP32, true, 0, 0}}) {
      ZERO_RETURN_IF_ERROR(engine->RegisterParam(spec).status());
    }
    ZERO_RETURN_IF_ERROR(engine->Finalize());
    return body(r, *engine);
  });
}

// Initial values that depend on the rank for "w" (unless `same`), equal everywhere for "b".
Status SetInitialParams(Engine& engine, int rank, bool same = false) {
  std::vector<float> w(35), b(7);
  for (int i = 0; i < 35; ++i) w[i] = 0.01f * i + (same ? 0.0f : 1.0f * rank);
  for (int i = 0; i < 7; ++i) b[i] = -0.5f + 0.1f * i;
  ZERO_RETURN_IF_ERROR(engine.SetParam(0, w.data()));
  return engine.SetParam(1, b.data());
}

// One iteration with the same gradients on every rank, then a step.
Status TrainOneStep(Engine& engine) {
  ZERO_RETURN_IF_ERROR(engine.Gather(0));
  ZERO_RETURN_IF_ERROR(engine.BeginIteration());
  std::vector<float> grad(35, 0.25f);
  ZERO_RETURN_IF_ERROR(engine.AccumulateGrad(1, grad.data()));
  ZERO_RETURN_IF_ERROR(engine.AccumulateGrad(0, grad.data()));
  ZERO_RETURN_IF_ERROR(engine.EndBackward());
  ZERO_RETURN_IF_ERROR(engine.Release(0));
  return engine.Step().status();
}

TEST(Replicas, BroadcastGivesEveryRankRank0sInitialValues) {
  for (int stage : {0, 1, 2}) {
    Config config;
    config.stage = stage;
    config.guard.timeout_s = 30;
    config.guard.replica_check_every = 1;
    std::vector<std::vector<float>> after(kWorld, std::vector<float>(35, -1.0f));
    const auto results = OnRanks(config, [&](int rank, Engine& engine) -> Status {
      ZERO_RETURN_IF_ERROR(SetInitialParams(engine, rank));
      ZERO_RETURN_IF_ERROR(engine.BeginIteration());
      ZERO_RETURN_IF_ERROR(engine.GetParam(0, after[rank].data()));
      std::vector<float> grad(35, 0.25f);
      ZERO_RETURN_IF_ERROR(engine.AccumulateGrad(1, grad.data()));
      ZERO_RETURN_IF_ERROR(engine.AccumulateGrad(0, grad.data()));
      ZERO_RETURN_IF_ERROR(engine.EndBackward());
      return engine.Step().status();  // the replica check after it passes
    });
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_THAT(results[r], IsOk()) << "stage " << stage << " rank " << r;
      for (int i = 0; i < 35; ++i) ASSERT_EQ(after[r][i], 0.01f * i) << "stage " << stage << " rank " << r;
    }
  }
}

// SyncReplicas does the first iteration's broadcast at once (a trainer computing before its
// first BeginIteration), and that iteration compares again: a write into rank 0's view in
// between still reaches every rank.
TEST(Replicas, SyncReplicasBroadcastsNowAndTheFirstIterationComparesAgain) {
  for (int stage : {0, 2}) {
    Config config;
    config.stage = stage;
    config.guard.timeout_s = 30;
    std::vector<std::vector<float>> synced(kWorld, std::vector<float>(35, -1.0f));
    std::vector<std::vector<float>> begun(kWorld, std::vector<float>(7, -1.0f));
    const auto results = OnRanks(config, [&](int rank, Engine& engine) -> Status {
      ZERO_RETURN_IF_ERROR(SetInitialParams(engine, rank));
      ZERO_RETURN_IF_ERROR(engine.SyncReplicas());
      ZERO_ASSIGN_OR_RETURN(void* w, engine.ParamData(0));
      std::copy_n(static_cast<const float*>(w), 35, synced[rank].data());
      if (rank == 0) {
        ZERO_ASSIGN_OR_RETURN(void* b, engine.ParamData(1));
        static_cast<float*>(b)[3] = 42.0f;
      }
      ZERO_RETURN_IF_ERROR(engine.BeginIteration());
      ZERO_RETURN_IF_ERROR(engine.GetParam(1, begun[rank].data()));
      const Status inside = engine.SyncReplicas();  // inside an iteration: refused
      if (inside.code() != absl::StatusCode::kFailedPrecondition) {
        return absl::InternalError(absl::StrCat("SyncReplicas inside an iteration gave ", inside.ToString()));
      }
      return absl::OkStatus();
    });
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_THAT(results[r], IsOk()) << "stage " << stage << " rank " << r;
      for (int i = 0; i < 35; ++i) ASSERT_EQ(synced[r][i], 0.01f * i) << "stage " << stage << " rank " << r;
      EXPECT_EQ(begun[r][3], 42.0f) << "stage " << stage << " rank " << r;
    }
  }
}

TEST(Replicas, VerifyNamesTheFirstDifferingParamAndRanks) {
  Config config;
  config.guard.timeout_s = 30;
  config.guard.init_params = InitParams::kVerify;
  const auto results = OnRanks(config, [](int rank, Engine& engine) -> Status {
    ZERO_RETURN_IF_ERROR(SetInitialParams(engine, rank));
    return engine.BeginIteration();
  });
  EXPECT_THAT(results, Each(StatusIs(absl::StatusCode::kInvalidArgument,
                                     AllOf(HasSubstr("\"w\" (index 0) on rank(s) 1, 2"), HasSubstr("init_params")))));
  const auto same = OnRanks(config, [](int rank, Engine& engine) -> Status {
    ZERO_RETURN_IF_ERROR(SetInitialParams(engine, rank, /*same=*/true));
    return engine.BeginIteration();
  });
  EXPECT_THAT(same, Each(IsOk()));
}

TEST(Replicas, AtStage3DifferentInitialValuesAreAnErrorNamingTheParam) {
  Config config;
  config.stage = 3;
  config.guard.timeout_s = 30;
  for (bool sync_first : {false, true}) {
    const auto results = OnRanks(config, [&](int rank, Engine& engine) -> Status {
      ZERO_RETURN_IF_ERROR(SetInitialParams(engine, rank));
      return sync_first ? engine.SyncReplicas() : engine.Gather(0);
    });
    EXPECT_THAT(results, Each(StatusIs(absl::StatusCode::kInvalidArgument,
                                       AllOf(HasSubstr("\"w\" (index 0)"), HasSubstr("stage 3")))))
        << (sync_first ? "SyncReplicas" : "Gather");
  }
}

// At stage 0 every rank steps its own full replica, so a write on one rank persists (at stages
// 1-2 the next all-gather overwrites what the rank does not own).
TEST(Replicas, ReplicaCheckCatchesAParamDataViewWrittenOnOneRank) {
  {
    Config config;
    config.stage = 0;
    config.guard.timeout_s = 30;
    config.guard.replica_check_every = 2;
    const auto results = OnRanks(config, [](int rank, Engine& engine) -> Status {
      ZERO_RETURN_IF_ERROR(SetInitialParams(engine, rank, /*same=*/true));
      ZERO_RETURN_IF_ERROR(TrainOneStep(engine));  // step 1: not checked
      ZERO_RETURN_IF_ERROR(TrainOneStep(engine));  // step 2: checked, equal
      if (rank == 1) {
        ZERO_ASSIGN_OR_RETURN(void* view, engine.ParamData(1));
        static_cast<float*>(view)[3] += 1.0f;
      }
      ZERO_RETURN_IF_ERROR(TrainOneStep(engine));  // step 3: not checked
      return TrainOneStep(engine);                 // step 4: checked
    });
    EXPECT_THAT(results, Each(StatusIs(absl::StatusCode::kDataLoss,
                                       AllOf(HasSubstr("after step 4"), HasSubstr("\"b\" (index 1) on rank(s) 1")))));
  }
}

}  // namespace
}  // namespace zero
