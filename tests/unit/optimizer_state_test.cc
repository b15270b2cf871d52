// runtime::OptimizerState on its own, rank by rank of a 3-rank plan at stages 1 and 2: the
// owned parts of every param tile it exactly across ranks, ReadOwned and VisitOwned read the
// params' values (bf16 widened to fp32 masters), and WriteOwned writes masters and moments back
// and rounds the bf16 model copy. No collective runs: each rank's state is built alone.
#include "runtime/optimizer_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "zero/communicator.h"

namespace zero::runtime {
namespace {

constexpr int kWorld = 3;

// Element i of param p: distinct, exact in bf16.
float Value(int p, int64_t i) { return static_cast<float>(p + 1) + 0.25f * static_cast<float>(i % 64); }

struct RankState {
  base::Allocator allocator;
  std::unique_ptr<DeviceOps> ops;
  base::Buffer params;
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<GradStore> grads;
  std::unique_ptr<OptimizerState> state;
};

class OptimizerStateTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    const int stage = GetParam();
    config_.stage = stage;
    config_.optimizer.type = OptimizerType::kAdamW;
    partition::PlanConfig plan_config;
    plan_config.world_size = kWorld;
    plan_config.stage = stage;
    plan_config.first_bucket_elems = 200;
    plan_config.reduce_bucket_elems = 700;
    std::vector<partition::ParamInfo> infos = {
        {"a", 300, DType::kFP32}, {"b", 77, DType::kBF16}, {"c", 1000, DType::kFP32}, {"d", 5, DType::kBF16}};
    auto plan = partition::PartitionPlan::Build(infos, plan_config);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_.emplace(std::move(*plan));
    for (int r = 0; r < kWorld; ++r) ASSERT_NO_FATAL_FAILURE(BuildRank(r));
  }

  void BuildRank(int rank) {
    RankState& s = ranks_[rank];
    auto ops = DeviceOps::Create(Device::kCpu, kernels::CpuExec{}, s.allocator);
    ASSERT_TRUE(ops.ok()) << ops.status();
    s.ops = std::move(*ops);
    auto params = s.allocator.Allocate(plan_->flat_bytes(), MemoryCategory::kParams, Placement::kHost);
    ASSERT_TRUE(params.ok());
    s.params = std::move(*params);
    for (size_t p = 0; p < plan_->params().size(); ++p) {  // every rank holds every param
      const auto& place = plan_->placement(static_cast<int>(p));
      const partition::Bucket& b = plan_->buckets()[place.bucket];
      char* at = s.params.as<char>() + b.byte_offset + plan_->ParamByteOffset(static_cast<int>(p));
      for (int64_t i = 0; i < place.numel; ++i) {
        const float v = Value(static_cast<int>(p), i);
        if (b.dtype == DType::kFP32) {
          std::memcpy(at + 4 * i, &v, 4);
        } else {
          const uint16_t bits = FloatToBf16(v);
          std::memcpy(at + 2 * i, &bits, 2);
        }
      }
    }
    // A 1-rank group stands in for the communicator: nothing here communicates.
    auto group = comm::CreateLocalGroup(1);
    ASSERT_TRUE(group.ok());
    s.comm = std::move((*group)[0]);
    auto grads = GradStore::Create(config_.stage, *plan_, 2, *s.comm, s.allocator, *s.ops);
    ASSERT_TRUE(grads.ok()) << grads.status();
    s.grads = std::move(*grads);
    OptimizerState::OwnedParams owned = [this, &s, rank](int bucket) {
      const partition::Bucket& b = plan_->buckets()[bucket];
      return s.params.as<char>() + b.byte_offset + b.shard_byte_offset(rank);
    };
    auto state = OptimizerState::Create(config_, *plan_, rank, owned, *s.grads, s.allocator, *s.ops, nullptr);
    ASSERT_TRUE(state.ok()) << state.status();
    s.state = std::move(*state);
    for (size_t p = 0; p < plan_->params().size(); ++p) ASSERT_TRUE(s.state->RefreshMaster(static_cast<int>(p)).ok());
  }

  Config config_;
  std::optional<partition::PartitionPlan> plan_;
  RankState ranks_[kWorld];
};

TEST_P(OptimizerStateTest, OwnedPartsTileEveryParamAcrossRanksAndHoldItsValues) {
  for (size_t p = 0; p < plan_->params().size(); ++p) {
    const int param = static_cast<int>(p);
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (int r = 0; r < kWorld; ++r) {
      const auto extents = ranks_[r].state->OwnedExtents(param);
      auto parts = ranks_[r].state->ReadOwned(param);
      ASSERT_TRUE(parts.ok()) << parts.status();
      ASSERT_EQ(parts->size(), extents.size());
      std::vector<float> scratch;
      size_t visited = 0;
      ASSERT_TRUE(ranks_[r].state->VisitOwned(param, &scratch, [&](int64_t begin, int64_t numel, const float* values) {
        const OptimizerState::OwnedPart& part = (*parts)[visited++];
        EXPECT_EQ(begin, part.begin);
        EXPECT_EQ(numel, part.numel);
        EXPECT_TRUE(std::equal(part.values.begin(), part.values.end(), values));
        return absl::OkStatus();
      }).ok());
      EXPECT_EQ(visited, parts->size());
      for (size_t k = 0; k < extents.size(); ++k) {
        const OptimizerState::OwnedPart& part = (*parts)[k];
        EXPECT_EQ(part.begin, extents[k].first);
        EXPECT_EQ(part.numel, extents[k].second);
        ASSERT_EQ(part.values.size(), static_cast<size_t>(part.numel * 3));  // weights, m, v
        for (int64_t i = 0; i < part.numel; ++i) {
          EXPECT_EQ(part.values[i], Value(param, part.begin + i)) << "param " << p << " element " << part.begin + i;
          EXPECT_EQ(part.values[part.numel + i], 0.0f);  // fresh moments
        }
        spans.emplace_back(part.begin, part.begin + part.numel);
      }
    }
    std::sort(spans.begin(), spans.end());
    int64_t covered = 0;
    for (const auto& [begin, end] : spans) {
      EXPECT_EQ(begin, covered) << "param " << p << ": a gap or an overlap between ranks";
      covered = end;
    }
    EXPECT_EQ(covered, plan_->placement(param).numel) << "param " << p;
  }
}

TEST_P(OptimizerStateTest, WrittenPartsReadBackAndRoundTheModelCopy) {
  for (int r = 0; r < kWorld; ++r) {
    for (size_t p = 0; p < plan_->params().size(); ++p) {
      const int param = static_cast<int>(p);
      auto parts = ranks_[r].state->ReadOwned(param);
      ASSERT_TRUE(parts.ok());
      for (OptimizerState::OwnedPart& part : *parts) {
        for (size_t i = 0; i < part.values.size(); ++i) part.values[i] = 1.0f / 3.0f + static_cast<float>(i);
      }
      ASSERT_TRUE(ranks_[r].state->WriteOwned(param, *parts).ok());
      auto again = ranks_[r].state->ReadOwned(param);
      ASSERT_TRUE(again.ok());
      for (size_t k = 0; k < parts->size(); ++k) EXPECT_EQ((*again)[k].values, (*parts)[k].values);
      // The bf16 model copy holds the new weights rounded to nearest even.
      const auto& place = plan_->placement(param);
      const partition::Bucket& b = plan_->buckets()[place.bucket];
      const char* model = ranks_[r].params.as<char>() + b.byte_offset + plan_->ParamByteOffset(param);
      for (const OptimizerState::OwnedPart& part : *parts) {
        for (int64_t i = 0; i < part.numel; ++i) {
          if (b.dtype == DType::kBF16) {
            uint16_t bits = 0;
            std::memcpy(&bits, model + 2 * (part.begin + i), 2);
            EXPECT_EQ(bits, FloatToBf16(part.values[i]));
          } else {
            float value = 0;
            std::memcpy(&value, model + 4 * (part.begin + i), 4);
            EXPECT_EQ(value, part.values[i]);
          }
        }
      }
      std::vector<OptimizerState::OwnedPart> wrong = *parts;
      if (!wrong.empty()) {
        wrong[0].numel += 1;
        EXPECT_EQ(ranks_[r].state->WriteOwned(param, wrong).code(), absl::StatusCode::kInternal);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, OptimizerStateTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace zero::runtime
