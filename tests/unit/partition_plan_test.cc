// PartitionPlan: a worked example, property tests over random param lists, world sizes 1-9,
// bucket caps and stages (every element of every param has exactly one owner, shards are
// equal, alignment, caps, reverse order, homogeneous buckets), and errors that name the param.
#include "partition/partition_plan.h"

#include <gtest/gtest.h>

#include <random>

namespace zero::partition {
namespace {

TEST(PartitionPlan, WorkedExample) {
  // Registration order a, b, c; backward order c, b, a. Cap 300 for the first bucket.
  std::vector<ParamInfo> params = {{"a", 200}, {"b", 100}, {"c", 150}};
  PlanConfig config;
  config.world_size = 2;
  config.first_bucket_elems = 300;
  config.reduce_bucket_elems = 1000;
  auto plan = PartitionPlan::Build(params, config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->buckets().size(), 2u);
  // Bucket 0: c at 0, b at 192 (150 rounded up to 64) → used 292 ≤ 300, padded to 512.
  const Bucket& b0 = plan->buckets()[0];
  EXPECT_EQ(b0.params, (std::vector<int>{2, 1}));
  EXPECT_EQ(b0.numel, 512);
  EXPECT_EQ(b0.shard_numel, 256);
  EXPECT_EQ(plan->placement(1).offset, 192);
  // Bucket 1: a alone (292 rounded to 320 + 200 > 300), padded to 256.
  const Bucket& b1 = plan->buckets()[1];
  EXPECT_EQ(b1.params, (std::vector<int>{0}));
  EXPECT_EQ(b1.numel, 256);
  EXPECT_EQ(b1.byte_offset, 512 * 4);
  EXPECT_EQ(b1.state_offset, 256);
  EXPECT_EQ(plan->state_numel(), 256 + 128);
  // b straddles the shard boundary at 256: rank 0 owns [0, 64), rank 1 owns [64, 100).
  const auto fragments = plan->FragmentsOfParam(1);
  ASSERT_EQ(fragments.size(), 2u);
  EXPECT_EQ(fragments[0].rank, 0);
  EXPECT_EQ(fragments[0].numel, 64);
  EXPECT_EQ(fragments[0].shard_begin, 192);
  EXPECT_EQ(fragments[1].rank, 1);
  EXPECT_EQ(fragments[1].param_begin, 64);
  EXPECT_EQ(fragments[1].shard_begin, 0);
  EXPECT_EQ(fragments[1].state_begin, 0);
}

std::vector<ParamInfo> RandomParams(std::mt19937& rng, int stage) {
  std::uniform_int_distribution<int> count(1, 40), group(0, 2), unit(0, 5), frozen(0, 9);
  std::uniform_int_distribution<int64_t> small(1, 300), large(1, 20000);
  std::vector<ParamInfo> params;
  const int n = count(rng);
  for (int i = 0; i < n; ++i) {
    ParamInfo p;
    p.name = "layer" + std::to_string(i) + ".weight";
    p.numel = (rng() % 4 == 0) ? large(rng) : small(rng);
    if (stage == 3) {
      p.unit = unit(rng);  // a unit's params share group, dtype and trainability
      p.group = p.unit % 2;
      p.dtype = p.unit % 3 == 0 ? DType::kBF16 : DType::kFP32;
      p.requires_grad = p.unit != 5;
    } else {
      p.group = group(rng);
      p.dtype = static_cast<DType>(rng() % 3);
      p.requires_grad = frozen(rng) != 0;
    }
    params.push_back(p);
  }
  return params;
}

// The byte offsets every buffer takes from the plan: a param inside its bucket, shards
// tiling a bucket, and the compact shard buffers (every bucket, or the trainable ones).
void CheckByteOffsets(const PartitionPlan& plan) {
  const int world = plan.config().world_size;
  for (size_t p = 0; p < plan.params().size(); ++p) {
    const ParamPlacement& place = plan.placement(static_cast<int>(p));
    const Bucket& b = plan.buckets()[place.bucket];
    EXPECT_EQ(plan.ParamByteOffset(static_cast<int>(p)), place.offset * static_cast<int64_t>(DTypeSize(b.dtype)));
    EXPECT_LE(plan.ParamByteOffset(static_cast<int>(p)) + place.numel * b.element_bytes(), b.bytes());
  }
  for (const bool trainable_only : {false, true}) {
    int64_t total = -1;
    const std::vector<int64_t> offsets = plan.CompactShardOffsets(trainable_only, &total);
    ASSERT_EQ(offsets.size(), plan.buckets().size());
    int64_t next = 0;
    for (const Bucket& b : plan.buckets()) {
      EXPECT_EQ(b.shard_bytes() * world, b.bytes());
      EXPECT_EQ(b.shard_byte_offset(world - 1) + b.shard_bytes(), b.bytes());
      if (trainable_only && !b.trainable) {
        EXPECT_EQ(offsets[b.index], -1);
        continue;
      }
      EXPECT_EQ(offsets[b.index], next);  // shards back to back, in bucket order
      next += b.shard_bytes();
    }
    EXPECT_EQ(total, next);
  }
}

void CheckInvariants(const PartitionPlan& plan) {
  const PlanConfig& c = plan.config();
  const int world = c.world_size;
  // Buckets: padded, equal shards, homogeneous, byte offsets contiguous.
  int64_t bytes = 0, state = 0;
  for (const Bucket& b : plan.buckets()) {
    ASSERT_EQ(b.numel % (world * c.shard_alignment), 0);
    ASSERT_EQ(b.shard_numel * world, b.numel);
    ASSERT_EQ(b.byte_offset, bytes);
    bytes += b.numel * static_cast<int64_t>(DTypeSize(b.dtype));
    if (b.trainable) {
      ASSERT_EQ(b.state_offset, state);
      state += b.shard_numel;
    }
    int64_t end = 0;
    for (int id : b.params) {
      const ParamInfo& p = plan.params()[id];
      const ParamPlacement& place = plan.placement(id);
      ASSERT_EQ(place.bucket, b.index);
      ASSERT_EQ(p.group, b.group);
      ASSERT_EQ(p.dtype, b.dtype);
      ASSERT_EQ(p.requires_grad, b.trainable);
      ASSERT_EQ(place.offset % c.param_alignment, 0) << p.name;
      ASSERT_GE(place.offset, end) << "params overlap in bucket " << b.index;
      end = place.offset + p.numel;
    }
    ASSERT_LE(end, b.numel);
    if (c.stage != 3 && b.params.size() > 1) {
      // Over the cap only as one oversized param with small companions laid out before it.
      const int64_t cap = std::max(c.first_bucket_elems, c.reduce_bucket_elems);
      if (end > cap) {
        const ParamInfo& last = plan.params()[b.params.back()];
        ASSERT_GT(last.numel, std::min(c.first_bucket_elems, c.reduce_bucket_elems)) << "bucket " << b.index;
        ASSERT_LE(plan.placement(b.params.back()).offset, cap / 16 + c.param_alignment) << "bucket " << b.index;
      }
    }
  }
  ASSERT_EQ(plan.flat_bytes(), bytes);
  ASSERT_EQ(plan.state_numel(), state);
  // Every element of every param: exactly one owner, inside that owner's shard.
  for (size_t id = 0; id < plan.params().size(); ++id) {
    const auto fragments = plan.FragmentsOfParam(static_cast<int>(id));
    const Bucket& b = plan.buckets()[plan.placement(id).bucket];
    int64_t covered = 0;
    for (const Fragment& f : fragments) {
      ASSERT_EQ(f.param_begin, covered) << "gap or overlap in " << plan.params()[id].name;
      ASSERT_GT(f.numel, 0);
      ASSERT_GE(f.shard_begin, 0);
      ASSERT_LE(f.shard_begin + f.numel, b.shard_numel);
      ASSERT_EQ(f.bucket_begin, f.rank * b.shard_numel + f.shard_begin);
      covered += f.numel;
    }
    ASSERT_EQ(covered, plan.params()[id].numel);
  }
  // Per rank: fragments tile disjoint parts of the optimizer state, in increasing order.
  for (int r = 0; r < world; ++r) {
    int64_t last_end = 0;
    for (const Fragment& f : plan.FragmentsOnRank(r)) {
      ASSERT_EQ(f.rank, r);
      if (!plan.buckets()[f.bucket].trainable) continue;
      ASSERT_GE(f.state_begin, last_end);
      last_end = f.state_begin + f.numel;
      ASSERT_LE(last_end, plan.state_numel());
    }
  }
  // The last trainable bucket (the first-registered trainable param's) fits its own cap, or
  // that param's size plus a quarter, or holds that param alone (stages 0-2).
  if (c.stage != 3 && c.last_bucket_elems > 0) {
    for (size_t id = 0; id < plan.params().size(); ++id) {
      if (!plan.params()[id].requires_grad) continue;
      const Bucket& last = plan.buckets()[plan.placement(static_cast<int>(id)).bucket];
      const ParamPlacement& end = plan.placement(last.params.back());
      const int64_t head = plan.params()[id].numel;
      if (last.params.size() > 1) {
        ASSERT_LE(end.offset + end.numel, std::max(c.last_bucket_elems, head + head / 4));
      }
      break;
    }
  }
  // Backward order: trainable params appear in decreasing registration index (stages 0-2).
  if (c.stage != 3) {
    int previous = INT32_MAX;
    for (const Bucket& b : plan.buckets()) {
      if (!b.trainable) continue;
      for (int id : b.params) {
        ASSERT_LT(id, previous);
        previous = id;
      }
    }
  }
}

TEST(PartitionPlan, PropertiesHoldForRandomModelsWorldsCapsAndStages) {
  std::mt19937 rng(2026);
  for (int trial = 0; trial < 400; ++trial) {
    const int stage = trial % 4;
    PlanConfig config;
    config.world_size = 1 + trial % 9;
    config.stage = stage;
    config.first_bucket_elems = 1 + rng() % 5000;
    config.reduce_bucket_elems = 1 + rng() % 30000;
    config.last_bucket_elems = rng() % 3 == 0 ? 0 : 1 + rng() % 5000;
    std::vector<ParamInfo> params = RandomParams(rng, stage);
    if (stage != 3 && trial % 8 < 4) {  // one group and dtype: long runs can share a bucket
      for (ParamInfo& p : params) {
        p.group = 0;
        p.dtype = DType::kFP32;
      }
    }
    auto plan = PartitionPlan::Build(params, config);
    ASSERT_TRUE(plan.ok()) << plan.status();
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " world " << config.world_size
                                      << " stage " << stage);
    CheckInvariants(*plan);
    CheckByteOffsets(*plan);
    if (HasFatalFailure()) return;
  }
}

TEST(PartitionPlan, LastBucketHoldsTheFirstRegisteredParamsUpToItsCap) {
  std::vector<ParamInfo> params;
  for (int i = 0; i < 6; ++i) params.push_back({"layer" + std::to_string(i), 100});
  PlanConfig config;
  config.world_size = 2;
  config.first_bucket_elems = config.reduce_bucket_elems = 1000;
  config.last_bucket_elems = 256;  // layer0 and layer1, 128 each rounded up; layer2 would reach 384
  auto plan = PartitionPlan::Build(params, config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->buckets().size(), 2u);
  EXPECT_EQ(plan->buckets()[0].params, (std::vector<int>{5, 4, 3, 2}));
  EXPECT_EQ(plan->buckets()[1].params, (std::vector<int>{1, 0}));

  config.last_bucket_elems = 50;  // layer0 alone exceeds it: the cap becomes 125, layer0 alone
  plan = PartitionPlan::Build(params, config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->buckets().size(), 2u);
  EXPECT_EQ(plan->buckets()[1].params, (std::vector<int>{0}));

  // A layer's weight larger than the cap keeps its bias with it (1024 + 64 ≤ 1000 · 1.25).
  std::vector<ParamInfo> layers = {{"l0.weight", 1000}, {"l0.bias", 10}, {"l1.weight", 1000},
                                   {"l1.bias", 10}};
  config.first_bucket_elems = config.reduce_bucket_elems = 4000;
  config.last_bucket_elems = 500;
  plan = PartitionPlan::Build(layers, config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->buckets().size(), 2u);
  EXPECT_EQ(plan->buckets()[0].params, (std::vector<int>{3, 2}));
  EXPECT_EQ(plan->buckets()[1].params, (std::vector<int>{1, 0}));
  config.first_bucket_elems = config.reduce_bucket_elems = 1000;

  config.last_bucket_elems = 0;  // no cap of its own: the whole model fits one bucket
  plan = PartitionPlan::Build(params, config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->buckets().size(), 1u);
}

TEST(PartitionPlan, LastBucketFitsItsCapWhateverOrderItIsLaidOutIn) {
  // Counted in registration order without rounding each param up, {64, 1} fitted 65 + 15
  // (the cap raised by a quarter of 64), but laid out in backward order, 1 then 64 aligned to
  // 64, the bucket ended at 128.
  std::vector<ParamInfo> params = {{"p0", 64}, {"p1", 1}, {"p2", 10000}};
  PlanConfig config;
  config.first_bucket_elems = config.reduce_bucket_elems = 20000;
  config.last_bucket_elems = 65;
  auto plan = PartitionPlan::Build(params, config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Bucket& last = plan->buckets().back();
  EXPECT_EQ(last.params, (std::vector<int>{0}));
  const ParamPlacement& end = plan->placement(last.params.back());
  EXPECT_LE(end.offset + end.numel, 80);
}

// Weights larger than the cap keep their biases (laid out just before them, gradients arriving
// with them) instead of leaving each bias a bucket of its own.
TEST(PartitionPlan, AnOversizedWeightKeepsItsBias) {
  std::vector<ParamInfo> params = {{"fc0.weight", 5000}, {"fc0.bias", 50}, {"fc1.weight", 5000}, {"fc1.bias", 50},
                                   {"norm.weight", 700}, {"norm.bias", 700}};
  PlanConfig config;
  config.first_bucket_elems = config.reduce_bucket_elems = 2000;
  config.last_bucket_elems = 0;
  auto plan = PartitionPlan::Build(params, config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::vector<int>> buckets;
  for (const Bucket& b : plan->buckets()) buckets.push_back(b.params);
  // fc1.bias fits the norm's bucket, but goes with its weight; each weight has its bias.
  EXPECT_EQ(buckets, (std::vector<std::vector<int>>{{5, 4}, {3, 2}, {1, 0}}));
}

TEST(PartitionPlan, Stage3BucketIsOneUnit) {
  std::vector<ParamInfo> params = {{"l0.w", 100, DType::kFP32, true, 0, 0},
                                   {"l0.b", 10, DType::kFP32, true, 0, 0},
                                   {"l1.w", 100, DType::kFP32, true, 0, 1},
                                   {"l1.b", 10, DType::kFP32, true, 0, 1}};
  PlanConfig config;
  config.world_size = 3;
  config.stage = 3;
  config.reduce_bucket_elems = 5;  // caps do not split units
  auto plan = PartitionPlan::Build(params, config);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->buckets().size(), 2u);
  EXPECT_EQ(plan->buckets()[0].unit, 1);
  EXPECT_EQ(plan->buckets()[0].params, (std::vector<int>{3, 2}));
  EXPECT_EQ(plan->buckets()[1].unit, 0);
}

TEST(PartitionPlan, ErrorsNameTheParamOrKey) {
  PlanConfig config;
  auto empty = PartitionPlan::Build({{"w", 0}}, config);
  EXPECT_NE(empty.status().message().find("\"w\""), std::string::npos);
  auto twice = PartitionPlan::Build({{"w", 3}, {"w", 4}}, config);
  EXPECT_NE(twice.status().message().find("twice"), std::string::npos);
  config.stage = 4;
  EXPECT_NE(PartitionPlan::Build({{"w", 3}}, config).status().message().find("stage"),
            std::string::npos);
  config.stage = 3;
  auto mixed = PartitionPlan::Build(
      {{"a", 3, DType::kFP32, true, 0, 7}, {"b", 3, DType::kBF16, true, 0, 7}}, config);
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mixed.status().message().find("\"b\""), std::string::npos) << mixed.status();
}

}  // namespace
}  // namespace zero::partition
