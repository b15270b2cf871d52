// runtime::GradStore on its own, on two in-process ranks at stages 0, 1 and 2: gradients added
// into each param's view are reduced by the bucket's collective into the part each rank steps
// (the sum over ranks, element by element of every param); after Zero a gradient handed over
// with Accumulate is copied then added, and a slot nobody wrote reduces as zeros. At stage 2 a
// bucket buffer returns to the pool when its reduction finishes, and not before (at world size
// 1 a reduction is no collective, only its Finish).
#include "runtime/grad_store.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/status_matchers.h"

namespace zero::runtime {
namespace {

using testing::IsOk;

constexpr int kWorld = 2;

float GradOf(int rank, int param, int64_t i) { return static_cast<float>((rank + 1) * (param + 1)) + 0.5f * (i % 7); }

class GradStoreTest : public ::testing::TestWithParam<int> {};

TEST_P(GradStoreTest, BucketReductionsLeaveEachRankTheSumOfItsShard) {
  const int stage = GetParam();
  partition::PlanConfig plan_config;
  plan_config.world_size = kWorld;
  plan_config.stage = stage;
  plan_config.first_bucket_elems = 200;
  plan_config.reduce_bucket_elems = 2000;
  auto plan = partition::PartitionPlan::Build({{"a", 300, DType::kFP32}, {"c", 1000, DType::kFP32}}, plan_config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->buckets().size(), 2u);  // within the pool: no rank waits for a buffer
  std::vector<int64_t> checked(kWorld, 0);
  const std::vector<Status> statuses = testing::RunOnRanks(kWorld, [&](int rank, comm::Communicator& comm) -> Status {
    base::Allocator allocator;
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<DeviceOps> ops, DeviceOps::Create(Device::kCpu, kernels::CpuExec{}, allocator));
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<GradStore> store, GradStore::Create(stage, *plan, 2, comm, allocator, *ops));
    auto reduce = [&]() -> Status {
      for (const partition::Bucket& b : plan->buckets()) {
        ZERO_ASSIGN_OR_RETURN(auto reduction, store->Reduction(b.index, /*last_micro_batch=*/true));
        ZERO_RETURN_IF_ERROR(reduction.first()->Wait(60));
        if (reduction.second) ZERO_RETURN_IF_ERROR(reduction.second());
      }
      return absl::OkStatus();
    };
    // Each rank's owned elements of both params against want(param, element).
    auto check = [&](const std::function<float(int, int64_t)>& want, const char* round) -> Status {
      for (int p = 0; p < 2; ++p) {
        for (const partition::Fragment& f : plan->FragmentsOfParam(p)) {
          if (f.rank != rank) continue;
          // The owned part starts at the rank's shard (stages 1-2) or the bucket's start (stage 0).
          const float* owned = static_cast<const float*>(store->OwnedGrad(f.bucket)) +
                               (f.bucket_begin - plan->Owned(f.bucket, rank).begin);
          for (int64_t k = 0; k < f.numel; ++k) {
            if (owned[k] != want(p, f.param_begin + k)) {
              return absl::InternalError(absl::StrCat(round, ": rank ", rank, " param ", p, " element ",
                                                      f.param_begin + k, ": ", owned[k], ", want ",
                                                      want(p, f.param_begin + k)));
            }
            ++checked[rank];
          }
        }
      }
      return absl::OkStatus();
    };
    // Round 1: every gradient added into its view, which starts at zero.
    for (int p = 0; p < 2; ++p) {
      if (store->NeedsBufferWait(plan->placement(p).bucket)) return absl::InternalError("no buffer wait expected");
      ZERO_ASSIGN_OR_RETURN(void* view, store->View(p));
      float* grad = static_cast<float*>(view);
      for (int64_t i = 0; i < plan->placement(p).numel; ++i) grad[i] += GradOf(rank, p, i);
    }
    ZERO_RETURN_IF_ERROR(reduce());
    ZERO_RETURN_IF_ERROR(check([](int p, int64_t i) { return GradOf(0, p, i) + GradOf(1, p, i); }, "round 1"));
    // Round 2: "a" handed over twice (copied, then added), "c" not at all: its slot, which
    // still holds round 1's values, reduces as zeros.
    ZERO_RETURN_IF_ERROR(store->Zero());
    std::vector<float> a(300);
    for (int64_t i = 0; i < 300; ++i) a[i] = GradOf(rank, 0, i);
    ZERO_RETURN_IF_ERROR(store->Accumulate(0, a.data(), DType::kFP32));
    ZERO_RETURN_IF_ERROR(store->Accumulate(0, a.data(), DType::kFP32));
    ZERO_RETURN_IF_ERROR(reduce());
    return check([](int p, int64_t i) { return p == 0 ? 2 * (GradOf(0, 0, i) + GradOf(1, 0, i)) : 0.0f; },
                 "round 2");
  });
  EXPECT_THAT(statuses, ::testing::Each(IsOk()));
  EXPECT_EQ(checked[0] + checked[1], 2 * 1300) << "every element of both params, on the rank that owns it";
}

INSTANTIATE_TEST_SUITE_P(Stages, GradStoreTest, ::testing::Values(0, 1, 2));

TEST(GradStorePool, ABufferReturnsToThePoolWhenItsReductionFinishes) {
  partition::PlanConfig plan_config;
  plan_config.world_size = 1;
  plan_config.stage = 2;
  plan_config.first_bucket_elems = 200;
  plan_config.reduce_bucket_elems = 2000;
  auto plan = partition::PartitionPlan::Build({{"a", 300, DType::kFP32}, {"c", 1000, DType::kFP32}}, plan_config);
  ASSERT_THAT(plan, IsOk());
  ASSERT_EQ(plan->buckets().size(), 2u);
  const int first = plan->placement(0).bucket, second = plan->placement(1).bucket;
  auto group = comm::CreateLocalGroup(1);
  ASSERT_THAT(group, IsOk());
  base::Allocator allocator;
  auto ops = DeviceOps::Create(Device::kCpu, kernels::CpuExec{}, allocator);
  ASSERT_THAT(ops, IsOk());
  auto store = GradStore::Create(2, *plan, /*pool_buffers=*/1, *(*group)[0], allocator, **ops);
  ASSERT_THAT(store, IsOk());
  EXPECT_EQ((*store)->pool_buffers(), 1);
  ASSERT_THAT((*store)->View(0), IsOk());  // takes the only buffer
  EXPECT_TRUE((*store)->NeedsBufferWait(second));
  EXPECT_FALSE((*store)->NeedsBufferWait(first));
  EXPECT_THAT((*store)->View(1), testing::StatusIs(absl::StatusCode::kFailedPrecondition));
  auto reduction = (*store)->Reduction(first, /*last_micro_batch=*/true);
  ASSERT_THAT(reduction, IsOk());
  EXPECT_FALSE(reduction->first) << "at world size 1 the reduction is no collective";
  EXPECT_TRUE((*store)->NeedsBufferWait(second)) << "still held until the reduction's Finish ran";
  ASSERT_THAT(reduction->second(), IsOk());
  EXPECT_FALSE((*store)->NeedsBufferWait(second));
  EXPECT_THAT((*store)->View(1), IsOk());
}

}  // namespace
}  // namespace zero::runtime
