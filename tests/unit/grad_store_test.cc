// runtime::GradStore on its own, on two in-process ranks at stages 1 and 2: gradients added
// into each param's view are reduced by the bucket's collective into the shard each rank
// steps (the sum over ranks, element by element of every param), and Zero clears them.
#include "runtime/grad_store.h"

#include <gtest/gtest.h>

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
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<GradStore> store,
                          GradStore::Create(stage, *plan, 2, comm, allocator, *ops,
                                            [] { return absl::InternalError("no buffer wait expected"); }));
    for (int p = 0; p < 2; ++p) {
      ZERO_ASSIGN_OR_RETURN(void* view, store->View(p));
      float* grad = static_cast<float*>(view);
      for (int64_t i = 0; i < plan->placement(p).numel; ++i) grad[i] += GradOf(rank, p, i);
    }
    for (const partition::Bucket& b : plan->buckets()) {
      ZERO_ASSIGN_OR_RETURN(auto reduction, store->Reduction(b.index, /*reduce=*/true));
      ZERO_RETURN_IF_ERROR(reduction.first()->Wait(60));
      if (reduction.second) ZERO_RETURN_IF_ERROR(reduction.second());
    }
    for (int p = 0; p < 2; ++p) {
      for (const partition::Fragment& f : plan->FragmentsOfParam(p)) {
        if (f.rank != rank) continue;
        const float* owned = static_cast<const float*>(store->OwnedGrad(f.bucket));
        for (int64_t k = 0; k < f.numel; ++k) {
          const float want = GradOf(0, p, f.param_begin + k) + GradOf(1, p, f.param_begin + k);
          if (owned[f.shard_begin + k] != want) {
            return absl::InternalError(absl::StrCat("rank ", rank, " param ", p, " element ", f.param_begin + k,
                                                    ": ", owned[f.shard_begin + k], ", want ", want));
          }
          ++checked[rank];
        }
      }
    }
    ZERO_RETURN_IF_ERROR(store->Zero());
    for (const partition::Bucket& b : plan->buckets()) {
      const float* owned = static_cast<const float*>(store->OwnedGrad(b.index));
      for (int64_t k = 0; k < b.shard_numel; ++k) {
        if (owned[k] != 0.0f) return absl::InternalError(absl::StrCat("rank ", rank, ": not zeroed"));
      }
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(statuses, ::testing::Each(IsOk()));
  EXPECT_EQ(checked[0] + checked[1], 1300) << "every element of both params, on the rank that owns it";
}

INSTANTIATE_TEST_SUITE_P(Stages, GradStoreTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace zero::runtime
