// Gradient precision (precision.grad, zero/config.h): bf16 and fp16 params whose gradients are
// accumulated and reduced in fp32, against PyTorch's AdamW in float64 on an fp32 master, at
// stages 0-3 on 2 and 3 in-process ranks; the same runs with 16-bit gradients lose what fp32
// keeps. Also the fp32 GradBuffer view, the plan's gradient layout and memory, and the refused
// combinations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "partition/partition_plan.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::RunOnRanks;
using testing::StatusIs;

constexpr int kMicroBatches = 4;
const std::vector<int64_t> kSizes = {1000, 37, 701, 5};  // odd sizes: params straddle shards
using Params = std::vector<std::vector<float>>;           // decoded, per param

uint16_t Encode(float v, DType d) { return d == DType::kBF16 ? FloatToBf16(v) : FloatToHalf(v); }
float Decode(uint16_t bits, DType d) { return d == DType::kBF16 ? Bf16ToFloat(bits) : HalfToFloat(bits); }
float Round(double v, DType d) { return Decode(Encode(static_cast<float>(v), d), d); }

// Deterministic value in [-1, 1) for (a, b, c, d).
double Uniform(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ b * 0xBF58476D1CE4E5B9ull ^ c * 0x94D049BB133111EBull ^
               d * 0xD6E8FEB86659FD93ull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return static_cast<double>(x >> 11) / 4503599627370496.0 - 1.0;
}

float Initial(int param, int64_t i, DType d) { return Round(Uniform(1, param, i, 0), d); }

// A gradient element as the trainer hands it over (exact in the param's dtype).
using GradFn = std::function<float(int step, int micro, int rank, int param, int64_t i)>;

// Every fourth element: a large gradient, two small ones that a 16-bit sum rounds away, and the
// large one taken back (many small gradients added to a large one): the true sum is 2^k, a
// bf16 accumulation (on each rank, or over ranks and micro-batches) ends at 0. The rest random.
float CancellingGrad(int step, int micro, int rank, int param, int64_t i) {
  if (i % 4 == 0) {
    const double sign = Uniform(2, param, i, 0) < 0 ? -1.0 : 1.0;
    const double big[kMicroBatches] = {256, 0.5, 0.5, -256};
    return static_cast<float>(std::ldexp(sign * big[micro], static_cast<int>(i / 4 % 5) - 2));
  }
  return Round(0.1 * Uniform(3 + step, micro * 16 + rank, param, i), DType::kBF16);
}

Config PrecisionConfig(int stage, DType param, DType grad) {
  Config c;
  c.stage = stage;
  c.optimizer.type = OptimizerType::kAdamW;
  c.optimizer.lr = 1e-2f;
  c.optimizer.weight_decay = 0.01f;
  c.precision.param = param;
  c.precision.grad = c.precision.reduce = grad;
  c.gradient_accumulation_steps = kMicroBatches;
  c.buckets.first_bucket_elems = 300;  // several buckets
  c.buckets.reduce_bucket_elems = 800;
  c.buckets.pool_buffers = 2;
  c.guard.timeout_s = 60;
  c.stage3.persistence_threshold = 0;  // every unit gathered on demand
  return c;
}

struct Outcome {
  Params params;  // rank 0's after the last step
  std::vector<StepInfo> infos;
};

// One rank: registers kSizes (param p is stage-3 unit p), sets Initial, trains `steps` steps of
// kMicroBatches micro-batches. Even params get their gradient through AccumulateGrad (the
// param's dtype), odd ones added into GradBuffer's view in the gradient dtype.
Status TrainRank(Engine& engine, int rank, const Config& c, int steps, const GradFn& grad, Outcome* run) {
  const DType dtype = c.precision.param;
  const int n = static_cast<int>(kSizes.size());
  for (int p = 0; p < n; ++p) {
    ZERO_RETURN_IF_ERROR(engine.RegisterParam({"p" + std::to_string(p), {kSizes[p]}, dtype, true, 0, p}).status());
  }
  ZERO_RETURN_IF_ERROR(engine.Finalize());
  for (int p = 0; p < n; ++p) {
    std::vector<uint16_t> init(kSizes[p]);
    for (int64_t i = 0; i < kSizes[p]; ++i) init[i] = Encode(Initial(p, i, dtype), dtype);
    ZERO_RETURN_IF_ERROR(engine.SetParam(p, init.data()));
  }
  for (int step = 0; step < steps; ++step) {
    for (int micro = 0; micro < kMicroBatches; ++micro) {
      ZERO_RETURN_IF_ERROR(engine.BeginIteration());
      for (int p = n - 1; p >= 0; --p) {  // backward order
        ZERO_RETURN_IF_ERROR(engine.Gather(p));
        std::vector<uint16_t> g(kSizes[p]);
        for (int64_t i = 0; i < kSizes[p]; ++i) g[i] = Encode(grad(step, micro, rank, p, i), dtype);
        if (p % 2 == 0) {
          ZERO_RETURN_IF_ERROR(engine.AccumulateGrad(p, g.data()));
        } else {
          ZERO_ASSIGN_OR_RETURN(void* view, engine.GradBuffer(p));
          for (int64_t i = 0; i < kSizes[p]; ++i) {
            if (c.precision.grad == DType::kFP32) {
              static_cast<float*>(view)[i] += Decode(g[i], dtype);
            } else {
              uint16_t& sum = static_cast<uint16_t*>(view)[i];
              sum = Encode(Decode(sum, dtype) + Decode(g[i], dtype), dtype);
            }
          }
          ZERO_RETURN_IF_ERROR(engine.GradReady(p));
        }
        ZERO_RETURN_IF_ERROR(engine.Release(p));
      }
      ZERO_RETURN_IF_ERROR(engine.EndBackward());
    }
    ZERO_ASSIGN_OR_RETURN(StepInfo info, engine.Step());
    run->infos.push_back(info);
  }
  run->params.assign(n, {});
  for (int p = 0; p < n; ++p) {
    std::vector<uint16_t> bits(kSizes[p]);
    ZERO_RETURN_IF_ERROR(engine.GetParam(p, bits.data()));
    for (uint16_t b : bits) run->params[p].push_back(Decode(b, dtype));
  }
  return absl::OkStatus();
}

// TrainRank on `world` ranks; every rank must end with the same params and step outcomes.
Outcome Train(int world, const Config& config, int steps, const GradFn& grad) {
  std::vector<Outcome> runs(world);
  EXPECT_THAT(RunOnRanks(world, [&](int r, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
    return TrainRank(*engine, r, config, steps, grad, &runs[r]);
  }), Each(IsOk()));
  for (int r = 1; r < world; ++r) EXPECT_EQ(runs[r].params, runs[0].params) << "rank " << r;
  return runs[0];
}

// PyTorch's AdamW in float64 on a master that starts at the 16-bit initial values (the engine's
// fp32 master, without its roundings). Step s's gradient is the float64 sum of the trainer's
// gradients over ranks and micro-batches, divided by world × loss_scales[s]; a loss scale of 0
// marks a skipped step. Returns the master rounded to `dtype`.
Params Reference(const Config& c, int world, const std::vector<double>& loss_scales, const GradFn& grad) {
  const DType dtype = c.precision.param;
  const OptimizerConfig& o = c.optimizer;
  Params out;
  for (int p = 0; p < static_cast<int>(kSizes.size()); ++p) {
    std::vector<float>& values = out.emplace_back();
    for (int64_t i = 0; i < kSizes[p]; ++i) {
      double w = Initial(p, i, dtype), m = 0, v = 0;
      int taken = 0;
      for (int s = 0; s < static_cast<int>(loss_scales.size()); ++s) {
        if (loss_scales[s] == 0) continue;
        double g = 0;
        for (int r = 0; r < world; ++r) {
          for (int k = 0; k < kMicroBatches; ++k) g += grad(s, k, r, p, i);
        }
        g /= world * loss_scales[s];
        ++taken;
        w *= 1.0 - double{o.lr} * o.weight_decay;
        m = o.beta1 * m + (1.0 - o.beta1) * g;
        v = o.beta2 * v + (1.0 - o.beta2) * g * g;
        const double bc1 = 1.0 - std::pow(double{o.beta1}, taken), bc2 = 1.0 - std::pow(double{o.beta2}, taken);
        w -= o.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + o.eps);
      }
      values.push_back(Round(w, dtype));
    }
  }
  return out;
}

// One 16-bit ulp at |v|.
double Ulp(double v, DType d) {
  const int mantissa = d == DType::kBF16 ? 7 : 10, min_exponent = d == DType::kBF16 ? -126 : -14;
  return std::ldexp(1.0, std::max(min_exponent, v == 0 ? min_exponent : std::ilogb(v)) - mantissa);
}

// Σ |got − want| in ulps of want; with `max_ulps` ≥ 0, fails where one element is further off.
double UlpDistance(const Params& got, const Params& want, DType d, double max_ulps) {
  double total = 0;
  for (size_t p = 0; p < want.size(); ++p) {
    for (size_t i = 0; i < want[p].size(); ++i) {
      const double ulps = std::fabs(double{got[p][i]} - want[p][i]) / Ulp(want[p][i], d);
      if (max_ulps >= 0) {
        EXPECT_LE(ulps, max_ulps) << "param " << p << " element " << i << ": " << got[p][i] << " vs " << want[p][i];
      }
      total += ulps;
    }
  }
  return total;
}

class Bf16WithFp32Gradients : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(Bf16WithFp32Gradients, MatchFloat64ReferenceAndBeatBf16Accumulation) {
  const auto [stage, world] = GetParam();
  constexpr int kSteps = 3;
  const Config fp32 = PrecisionConfig(stage, DType::kBF16, DType::kFP32);
  const Params want = Reference(fp32, world, std::vector<double>(kSteps, 1.0), CancellingGrad);
  const Outcome wide = Train(world, fp32, kSteps, CancellingGrad);
  const Outcome narrow = Train(world, PrecisionConfig(stage, DType::kBF16, DType::kBF16), kSteps, CancellingGrad);
  ASSERT_EQ(wide.params.size(), kSizes.size());
  ASSERT_EQ(narrow.params.size(), kSizes.size());
  const double wide_off = UlpDistance(wide.params, want, DType::kBF16, 2.0);
  const double narrow_off = UlpDistance(narrow.params, want, DType::kBF16, -1);
  EXPECT_LT(wide_off, narrow_off) << "fp32 accumulation is not closer to the reference than bf16's";
  EXPECT_GT(narrow_off, 100.0) << "the case was meant to make bf16 accumulation visibly lose";
}

INSTANTIATE_TEST_SUITE_P(StagesAndWorlds, Bf16WithFp32Gradients,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(2, 3)));

// fp16 params, fp32 gradients, dynamic loss scaling (2^4, halving at the first overflow). Step
// 0: an Inf on one rank skips it everywhere. Step 1, at scale 8: every fourth element sums to
// 4 × 30000 per rank, beyond fp16's 65504, so fp16 accumulation overflows and skips the step
// again where fp32 accumulation steps it like the float64 reference.
TEST(Fp16WithFp32Gradients, DynamicLossScalingStepsWhatFp16AccumulationOverflows) {
  constexpr int kWorld = 2;
  const GradFn grad = [](int step, int micro, int rank, int param, int64_t i) -> float {
    if (step == 0 && rank == 1 && micro == 2 && param == 0 && i == 0) return INFINITY;
    const double scale = step == 0 ? 16 : 8;
    if (i % 4 == 0) return static_cast<float>(scale * 3750);
    return Round(scale * 0.1 * Uniform(5 + step, micro * 16 + rank, param, i), DType::kFP16);
  };
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Config fp32 = PrecisionConfig(stage, DType::kFP16, DType::kFP32);
    fp32.loss_scale.mode = LossScaleMode::kDynamic;
    fp32.loss_scale.initial_power = 4;
    fp32.loss_scale.hysteresis = 1;
    const Outcome wide = Train(kWorld, fp32, 2, grad);
    ASSERT_EQ(wide.infos.size(), 2u);
    EXPECT_TRUE(wide.infos[0].skipped);
    EXPECT_FALSE(wide.infos[1].skipped);
    EXPECT_EQ(wide.infos[1].step, 1);
    EXPECT_EQ(wide.infos[1].loss_scale, 8.0f);
    ASSERT_EQ(wide.params.size(), kSizes.size());
    UlpDistance(wide.params, Reference(fp32, kWorld, {0.0, 8.0}, grad), DType::kFP16, 2.0);

    Config fp16 = fp32;
    fp16.precision.grad = fp16.precision.reduce = DType::kFP16;
    const Outcome narrow = Train(kWorld, fp16, 2, grad);
    ASSERT_EQ(narrow.infos.size(), 2u);
    EXPECT_TRUE(narrow.infos[1].skipped) << "fp16 accumulation was meant to overflow";
  }
}

// GradBuffer's view of a bf16 param is fp32: values no bf16 holds, written as floats, are what
// the step uses (SGD, lr 1, from 0: the param becomes −(mean gradient), rounded to bf16).
TEST(GradBufferView, IsFp32ForBf16ParamsWithFp32Gradients) {
  constexpr int kWorld = 2;
  constexpr int64_t kNumel = 257;
  for (int stage = 0; stage <= 3; ++stage) {
    Config c = PrecisionConfig(stage, DType::kBF16, DType::kFP32);
    c.optimizer.type = OptimizerType::kSgd;
    c.optimizer.lr = 1.0f;
    c.optimizer.weight_decay = 0.0f;
    c.gradient_accumulation_steps = 1;
    std::vector<std::vector<uint16_t>> after(kWorld, std::vector<uint16_t>(kNumel));
    ASSERT_THAT(RunOnRanks(kWorld, [&](int r, comm::Communicator& comm) -> Status {
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(c, comm));
      ZERO_ASSIGN_OR_RETURN(ParamId id, engine->RegisterParam({"w", {kNumel}, DType::kBF16, true, 0, 0}));
      ZERO_RETURN_IF_ERROR(engine->Finalize());
      ZERO_RETURN_IF_ERROR(engine->SetParam(id, std::vector<uint16_t>(kNumel, 0).data()));
      ZERO_RETURN_IF_ERROR(engine->BeginIteration());
      ZERO_RETURN_IF_ERROR(engine->Gather(0));
      ZERO_ASSIGN_OR_RETURN(void* view, engine->GradBuffer(id));
      float* grad = static_cast<float*>(view);
      for (int64_t i = 0; i < kNumel; ++i) {
        if (grad[i] != 0.0f) return absl::InternalError("the fp32 gradient does not start at zero");
        grad[i] += static_cast<float>((r + 1) * (1.0 + std::ldexp(i, -12)));
      }
      ZERO_RETURN_IF_ERROR(engine->GradReady(id));
      ZERO_RETURN_IF_ERROR(engine->Release(0));
      ZERO_RETURN_IF_ERROR(engine->EndBackward());
      ZERO_RETURN_IF_ERROR(engine->Step().status());
      return engine->GetParam(id, after[r].data());
    }), Each(IsOk())) << "stage " << stage;
    for (int64_t i = 0; i < kNumel; ++i) {
      ASSERT_EQ(after[0][i], FloatToBf16(static_cast<float>(-1.5 * (1.0 + std::ldexp(i, -12)))))
          << "stage " << stage << " element " << i;
    }
  }
}

// Gradient bytes follow the gradient dtype: twice those of bf16 gradients, for the store
// (stages 0-1 whole, 2-3 a shard) and the stage-2/3 bucket buffers; the params keep theirs.
TEST(GradientMemory, CountsTheGradientDtype) {
  for (int stage = 0; stage <= 3; ++stage) {
    MemoryStats stats[2];
    for (int wide = 0; wide < 2; ++wide) {
      const Config c = PrecisionConfig(stage, DType::kBF16, wide ? DType::kFP32 : DType::kBF16);
      ASSERT_THAT(RunOnRanks(2, [&](int r, comm::Communicator& comm) -> Status {
        ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(c, comm));
        for (size_t p = 0; p < kSizes.size(); ++p) {
          ZERO_RETURN_IF_ERROR(engine->RegisterParam({"p" + std::to_string(p), {kSizes[p]}, DType::kBF16, true, 0,
                                                      static_cast<int>(p)}).status());
        }
        ZERO_RETURN_IF_ERROR(engine->RegisterParam({"frozen", {999}, DType::kBF16, false, 0, 9}).status());
        ZERO_RETURN_IF_ERROR(engine->Finalize());
        if (r == 0) stats[wide] = engine->GetMemoryStats();
        return absl::OkStatus();
      }), Each(IsOk()));
    }
    SCOPED_TRACE("stage " + std::to_string(stage));
    EXPECT_GT(stats[0].Current(MemoryCategory::kGrads), 0);
    EXPECT_EQ(stats[1].Current(MemoryCategory::kGrads), 2 * stats[0].Current(MemoryCategory::kGrads));
    EXPECT_EQ(stats[1].Current(MemoryCategory::kCommBuffers), 2 * stats[0].Current(MemoryCategory::kCommBuffers));
    EXPECT_EQ(stats[1].Current(MemoryCategory::kParams), stats[0].Current(MemoryCategory::kParams));
  }
}

// The plan: each trainable bucket's gradient dtype and layout next to its params'.
TEST(GradientLayout, PlanLaysOutGradientsInTheirDtype) {
  partition::PlanConfig config;
  config.world_size = 3;
  config.stage = 2;
  config.first_bucket_elems = 200;
  config.reduce_bucket_elems = 700;
  config.grad = DType::kFP32;
  auto plan = partition::PartitionPlan::Build({{"a", 300, DType::kFP32}, {"b", 77, DType::kBF16},
                                               {"c", 1000, DType::kBF16, false}, {"d", 5, DType::kFP16}}, config);
  ASSERT_THAT(plan, IsOk());
  int64_t flat = 0, shards = 0;
  for (const partition::Bucket& b : plan->buckets()) {
    if (!b.trainable) {
      EXPECT_EQ(b.grad_byte_offset, -1);
      EXPECT_EQ(b.grad_shard_offset, -1);
      continue;
    }
    EXPECT_EQ(b.grad_dtype, DType::kFP32) << "bucket " << b.index;
    EXPECT_EQ(b.grad_bytes(), 4 * b.numel);
    EXPECT_EQ(b.bytes(), b.numel * static_cast<int64_t>(DTypeSize(b.dtype)));
    EXPECT_EQ(b.grad_shard_byte_offset(2), 2 * b.grad_shard_bytes());
    EXPECT_EQ(b.grad_byte_offset, flat);
    EXPECT_EQ(b.grad_shard_offset, shards);
    flat += b.grad_bytes();
    shards += b.grad_shard_bytes();
    for (int p : b.params) EXPECT_EQ(plan->ParamGradByteOffset(p), 4 * plan->placement(p).offset);
  }
  EXPECT_EQ(plan->grad_flat_bytes(), flat);
  EXPECT_EQ(plan->grad_shards_bytes(), shards);
  EXPECT_EQ(plan->ParamGradBytes(1), 4 * 77);
  EXPECT_EQ(plan->ParamBytes(1), 2 * 77);

  config.grad = DType::kBF16;  // fp32 "a" cannot have bf16 gradients; frozen params have none
  EXPECT_THAT(partition::PartitionPlan::Build({{"a", 300, DType::kFP32}, {"b", 77, DType::kBF16}}, config),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("\"a\"")));
  auto bf16 = partition::PartitionPlan::Build({{"a", 300, DType::kFP32, false}, {"b", 77, DType::kBF16}}, config);
  ASSERT_THAT(bf16, IsOk());
  EXPECT_EQ(bf16->buckets()[bf16->placement(1).bucket].grad_dtype, DType::kBF16);
}

// Combinations other than "the param's own dtype" and "fp32" are kUnimplemented at
// RegisterParam, naming the param and the fix; frozen params have no gradient to refuse.
TEST(GradientDTypeCombinations, OthersAreRefusedNamingTheParamAndTheFix) {
  auto group = comm::CreateLocalGroup(1);
  ASSERT_THAT(group, IsOk());
  const struct {
    DType param, grad;
    const char* fix;
  } refused[] = {{DType::kFP32, DType::kBF16, "to fp32"}, {DType::kBF16, DType::kFP16, "to bf16 or fp32"},
                 {DType::kFP16, DType::kBF16, "to fp16 or fp32"}};
  for (const auto& c : refused) {
    auto engine = Engine::Create(PrecisionConfig(1, c.param, c.grad), *(*group)[0]);
    ASSERT_THAT(engine, IsOk());
    EXPECT_THAT((*engine)->RegisterParam({"layer.w", {8}, c.param}),
                StatusIs(absl::StatusCode::kUnimplemented,
                         ::testing::AllOf(HasSubstr("\"layer.w\""), HasSubstr("precision.grad"), HasSubstr(c.fix))));
    EXPECT_THAT((*engine)->RegisterParam({"frozen", {8}, c.param, false}), IsOk());
  }
  for (DType param : {DType::kFP32, DType::kBF16, DType::kFP16}) {
    auto engine = Engine::Create(PrecisionConfig(1, param, DType::kFP32), *(*group)[0]);
    ASSERT_THAT(engine, IsOk());
    EXPECT_THAT((*engine)->RegisterParam({"w", {8}, param}), IsOk()) << DTypeName(param);
  }
  Config mismatch = PrecisionConfig(1, DType::kBF16, DType::kFP32);
  mismatch.precision.reduce = DType::kBF16;
  EXPECT_THAT(Engine::Create(mismatch, *(*group)[0]), StatusIs(absl::StatusCode::kUnimplemented));
}

}  // namespace
}  // namespace zero
