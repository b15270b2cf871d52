// runtime::ParamStore on its own, on three in-process ranks (a count that is not a power of
// two): every stage's store holds what SetParam gave it, each rank's owned part is where the
// plan says, and after a step every rank sees the parts the others updated. At stage 3 units
// are gathered, viewed and released, within stage3.max_live_elems.
#include "runtime/param_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/status_matchers.h"

namespace zero::runtime {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

constexpr int kWorld = 3;
const std::vector<int64_t> kNumels = {300, 1000, 77};  // units 0, 1 and 2 at stage 3

float Initial(int param, int64_t i) { return static_cast<float>(param * 1000 + i) * 0.25f; }
float Updated(int param, int64_t i) { return -Initial(param, i) - 1.0f; }

// The plan, store and the pieces it works with, on one rank.
struct RankStore {
  base::Allocator allocator;
  std::unique_ptr<DeviceOps> ops;
  std::unique_ptr<CollectivePath> path;
  EngineCounters counters;
  std::unique_ptr<ParamStore> store;
};

StatusOr<partition::PartitionPlan> MakePlan(int stage) {
  std::vector<partition::ParamInfo> infos;
  for (size_t p = 0; p < kNumels.size(); ++p) {
    infos.push_back({absl::StrCat("p", p), kNumels[p], DType::kFP32, true, 0, static_cast<int>(p)});
  }
  partition::PlanConfig plan_config;
  plan_config.world_size = kWorld;
  plan_config.stage = stage;
  plan_config.first_bucket_elems = 200;
  plan_config.reduce_bucket_elems = 500;
  return partition::PartitionPlan::Build(infos, plan_config);
}

Status Open(const Config& config, const partition::PartitionPlan& plan, comm::Communicator& comm, RankStore* s) {
  ZERO_ASSIGN_OR_RETURN(s->ops, DeviceOps::Create(Device::kCpu, kernels::CpuExec{}, s->allocator));
  s->path = std::make_unique<CollectivePath>(comm, *s->ops, 60);
  base::Logger logger(base::LogLevel::kWarn, comm.rank());
  ZERO_ASSIGN_OR_RETURN(s->store, ParamStore::Create({config, plan, *s->path, s->allocator, *s->ops, logger, s->counters}));
  return absl::OkStatus();
}

// Each rank writes Updated() into the part of every bucket it owns, as an optimizer step does.
void StepOwnedParts(const partition::PartitionPlan& plan, int rank, ParamStore& store) {
  for (size_t p = 0; p < kNumels.size(); ++p) {
    const partition::ParamPlacement& place = plan.placement(static_cast<int>(p));
    const partition::OwnedSpan owned = plan.Owned(place.bucket, rank);
    float* part = reinterpret_cast<float*>(store.Owned(place.bucket));
    for (int64_t i = 0; i < place.numel; ++i) {
      const int64_t at = place.offset + i;
      if (at >= owned.begin && at < owned.begin + owned.numel) part[at - owned.begin] = Updated(static_cast<int>(p), i);
    }
  }
}

Status ExpectValues(ParamStore& store, int param, float (*want)(int, int64_t)) {
  std::vector<float> got(kNumels[param], -7.0f);  // poison
  ZERO_RETURN_IF_ERROR(store.Get(param, got.data()));
  for (int64_t i = 0; i < kNumels[param]; ++i) {
    if (got[i] != want(param, i)) {
      return absl::InternalError(absl::StrCat("param ", param, " element ", i, ": ", got[i], ", want ", want(param, i)));
    }
  }
  return absl::OkStatus();
}

class ParamStoreTest : public ::testing::TestWithParam<int> {};

TEST_P(ParamStoreTest, HoldsSetValuesAndAfterAStepEveryRankSeesEveryUpdate) {
  Config config;
  config.stage = GetParam();
  config.stage3.persistence_threshold = 0;
  auto plan = MakePlan(config.stage);
  ASSERT_THAT(plan, IsOk());
  EXPECT_THAT(testing::RunOnRanks(kWorld, [&](int rank, comm::Communicator& comm) -> Status {
    RankStore s;
    ZERO_RETURN_IF_ERROR(Open(config, *plan, comm, &s));
    for (int p = 0; p < 3; ++p) {
      std::vector<float> values(kNumels[p]);
      for (int64_t i = 0; i < kNumels[p]; ++i) values[i] = Initial(p, i);
      ZERO_RETURN_IF_ERROR(s.store->Set(p, values.data()));
    }
    for (int p = 0; p < 3; ++p) ZERO_RETURN_IF_ERROR(ExpectValues(*s.store, p, Initial));
    ZERO_RETURN_IF_ERROR(s.store->Gather(1));  // stage 3: held across the step
    StepOwnedParts(*plan, rank, *s.store);
    ZERO_RETURN_IF_ERROR(s.store->AfterStep(/*updated=*/true));
    for (int p = 0; p < 3; ++p) ZERO_RETURN_IF_ERROR(ExpectValues(*s.store, p, Updated));
    const float* view = static_cast<const float*>(s.store->View(1));
    for (int64_t i = 0; i < kNumels[1]; ++i) {
      if (view[i] != Updated(1, i)) return absl::InternalError(absl::StrCat("view of param 1 at ", i, ": ", view[i]));
    }
    return s.store->Release(1, false);
  }), Each(IsOk()));
}

TEST_P(ParamStoreTest, ReplicaHashesAgreeForEqualValuesAndDifferOtherwise) {
  Config config;
  config.stage = GetParam();
  auto plan = MakePlan(config.stage);
  ASSERT_THAT(plan, IsOk());
  std::vector<uint64_t> hashes(kWorld);
  EXPECT_THAT(testing::RunOnRanks(kWorld, [&](int rank, comm::Communicator& comm) -> Status {
    RankStore s;
    ZERO_RETURN_IF_ERROR(Open(config, *plan, comm, &s));
    std::vector<float> values(kNumels[1], 1.5f);
    if (rank == 2) values[17] = 2.5f;
    ZERO_RETURN_IF_ERROR(s.store->Set(1, values.data()));
    ZERO_ASSIGN_OR_RETURN(hashes[rank], s.store->ReplicaHash(1));
    if (!s.store->holds_replicas()) return absl::OkStatus();
    ZERO_RETURN_IF_ERROR(s.store->BroadcastFromRank0(1));
    std::vector<float> got(kNumels[1]);
    ZERO_RETURN_IF_ERROR(s.store->Get(1, got.data()));
    if (got[17] != 1.5f) return absl::InternalError(absl::StrCat("rank ", rank, " kept ", got[17]));
    return absl::OkStatus();
  }), Each(IsOk()));
  EXPECT_EQ(hashes[0], hashes[1]);
  EXPECT_NE(hashes[0], hashes[2]);
}

INSTANTIATE_TEST_SUITE_P(Stages, ParamStoreTest, ::testing::Values(0, 1, 2, 3));

TEST(ShardedParamStore, UnitsAreViewedOnlyWhileGatheredEvenBeyondTheLiveLimit) {
  Config config;
  config.stage = 3;
  config.stage3.persistence_threshold = 0;
  config.stage3.prefetch_elems = 0;
  auto plan = MakePlan(3);
  ASSERT_THAT(plan, IsOk());
  const int64_t unit1 = plan->buckets()[plan->placement(1).bucket].numel;
  const int64_t unit0 = plan->buckets()[plan->placement(0).bucket].numel;
  config.stage3.max_live_elems = unit1 + unit0 - 1;  // units 0 and 1 do not fit together
  EXPECT_THAT(testing::RunOnRanks(kWorld, [&](int, comm::Communicator& comm) {
    RankStore s;
    ASSERT_THAT(Open(config, *plan, comm, &s), IsOk());
    std::vector<float> values(kNumels[1]);
    for (int64_t i = 0; i < kNumels[1]; ++i) values[i] = Initial(1, i);
    ASSERT_THAT(s.store->Set(1, values.data()), IsOk());
    EXPECT_EQ(s.store->View(1), nullptr);
    ASSERT_THAT(s.store->Gather(1), IsOk());
    const float* view = static_cast<const float*>(s.store->View(1));
    ASSERT_NE(view, nullptr);
    EXPECT_EQ(view[999], Initial(1, 999));
    values[999] = 42.0f;
    ASSERT_THAT(s.store->Set(1, values.data()), IsOk());
    EXPECT_EQ(view[999], 42.0f) << "Set updates a gathered copy too";
    // Beyond the limit a gather the trainer asks for goes ahead (the limit bounds keeping
    // and prefetching, as DeepSpeed's stage3_max_live_parameters).
    ASSERT_THAT(s.store->Gather(0), IsOk());
    EXPECT_NE(s.store->View(0), nullptr);
    ASSERT_THAT(s.store->Release(0, false), IsOk());
    EXPECT_THAT(s.store->Gather(9), StatusIs(absl::StatusCode::kNotFound, HasSubstr("unit 9")));
    ASSERT_THAT(s.store->Release(1, false), IsOk());
    EXPECT_EQ(s.store->View(1), nullptr);
    EXPECT_THAT(s.store->Release(1, false), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not gathered")));
    ASSERT_THAT(s.store->Gather(0), IsOk());  // within the limit now
    EXPECT_EQ(s.counters.gathers_on_demand, 3);
    ASSERT_THAT(s.store->Release(0, false), IsOk());
    EXPECT_NE(s.store->ReplicaHash(1).value_or(0), 0u);
    ASSERT_THAT(s.store->AfterLoad(), IsOk());
    EXPECT_EQ(s.store->ReplicaHash(1).value_or(1), 0u) << "a load forgets the values given to Set";
    EXPECT_THAT(s.store->BroadcastFromRank0(1), StatusIs(absl::StatusCode::kFailedPrecondition));
  }), Each(IsOk()));
}

}  // namespace
}  // namespace zero::runtime
