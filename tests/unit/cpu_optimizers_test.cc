// Every CPU optimizer kernel against a float64 reference, on fresh random inputs, for every
// instruction set this CPU runs, every (param, grad) dtype combination and odd sizes, with the
// low-precision outputs poisoned before each run. Also: skip-on-overflow, bit-identical results
// across thread counts, and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "kernels/cpu/norms.h"
#include "kernels/cpu/optimizers.h"
#include "tests/status_matchers.h"
#include "tests/unit/kernel_test_util.h"

namespace zero::kernels {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::AllTypeCombinations;
using testing::Describe;
using testing::IsOk;
using testing::OddSizes;
using testing::SegmentStorage;
using testing::StatusIs;
using testing::SupportedIsas;
using testing::AdamReference;
using testing::SgdReference;
using testing::ToLowPrecision;

/// Absolute slack per quantity on top of a relative 2e-6: a few fp32 ulps of the largest
/// operand, for results that land near zero by cancellation.
struct Tolerance {
  double weight = 5e-7, state0 = 5e-8, state1 = 1e-9;
};

using RunFn = std::function<Status(SegmentTypes, absl::Span<const Segment>, const CpuExec&)>;
/// The float64 reference for one element: updates w, m, v in place given the gradient as the
/// kernel reads it. Returns false when the element's result is too close to a decision boundary
/// (Lion's sign of a near-zero value) to be compared.
using ReferenceFn = std::function<bool(double& w, double& m, double& v, double g)>;

void ExpectNear(double got, double want, double atol, const char* what, int64_t i,
                const std::string& where) {
  ASSERT_LE(std::fabs(got - want), 2e-6 * std::fabs(want) + atol)
      << what << "[" << i << "] " << where << ": got " << got << ", want " << want;
}

// Runs `run` on two segments (the given size and a ragged 3) and compares every element.
void CheckAgainstReference(const RunFn& run, const ReferenceFn& reference, bool uses_state1,
                           Tolerance tol = {}) {
  for (base::CpuIsa isa : SupportedIsas()) {
    for (SegmentTypes types : AllTypeCombinations()) {
      for (int64_t numel : OddSizes()) {
        const std::string where = Describe(isa, types) + "/n=" + std::to_string(numel);
        std::mt19937_64 rng(numel * 131 + static_cast<int>(isa) * 17 +
                            static_cast<int>(types.param) * 5 + static_cast<int>(types.grad));
        std::vector<SegmentStorage> storage;
        storage.emplace_back(numel, types, rng);
        storage.emplace_back(3, types, rng);
        const std::vector<SegmentStorage> before = storage;
        std::vector<Segment> segments = {storage[0].View(), storage[1].View()};
        ASSERT_THAT(run(types, segments, CpuExec{isa, 0}), IsOk()) << where;
        for (size_t s = 0; s < storage.size(); ++s) {
          const SegmentStorage& got = storage[s];
          const SegmentStorage& init = before[s];
          for (size_t i = 0; i < got.master.size(); ++i) {
            double w = init.master[i], m = init.state0[i], v = init.state1[i];
            if (!reference(w, m, v, init.Grad(i, types.grad))) continue;
            ExpectNear(got.master[i], w, tol.weight, "weight", i, where);
            ExpectNear(got.state0[i], m, tol.state0, "state0", i, where);
            if (uses_state1) ExpectNear(got.state1[i], v, tol.state1, "state1", i, where);
            if (types.param != DType::kFP32) {
              ASSERT_EQ(got.model_param[i], ToLowPrecision(got.master[i], types.param))
                  << "low-precision copy of " << got.master[i] << " at " << i << " " << where;
            }
          }
        }
      }
    }
  }
}

AdamHyper TestAdam(bool adamw) {
  AdamHyper h;
  h.lr = 1e-2f;
  h.beta1 = 0.9f;
  h.beta2 = 0.99f;
  h.eps = 1e-8f;
  h.weight_decay = 0.1f;
  h.decoupled_weight_decay = adamw;
  h.step = 3;
  h.common.grad_scale = 0.5f;
  return h;
}

TEST(CpuAdam, AdamWMatchesFloat64Reference) {
  const AdamHyper h = TestAdam(true);
  CheckAgainstReference(
      [&](SegmentTypes t, absl::Span<const Segment> s, const CpuExec& e) {
        return AdamStepCpu(h, t, s, e);
      },
      [&](double& w, double& m, double& v, double g) { return AdamReference(h, w, m, v, g); },
      true);
}

TEST(CpuAdam, AdamWithL2DecayMatchesFloat64Reference) {
  const AdamHyper h = TestAdam(false);
  CheckAgainstReference(
      [&](SegmentTypes t, absl::Span<const Segment> s, const CpuExec& e) {
        return AdamStepCpu(h, t, s, e);
      },
      [&](double& w, double& m, double& v, double g) { return AdamReference(h, w, m, v, g); },
      true);
}

TEST(CpuSgd, MomentumDampeningNesterovMatchFloat64Reference) {
  for (bool nesterov : {false, true}) {
    for (int64_t step : {1, 4}) {
      for (float momentum : {0.0f, 0.9f}) {
        if (nesterov && momentum == 0.0f) continue;
        SgdHyper h;
        h.lr = 0.05f;
        h.momentum = momentum;
        h.dampening = nesterov ? 0.0f : 0.1f;
        h.weight_decay = 0.01f;
        h.nesterov = nesterov;
        h.step = step;
        h.common.grad_scale = 2.0f;
        SCOPED_TRACE(::testing::Message() << "nesterov=" << nesterov << " step=" << step
                                          << " momentum=" << momentum);
        CheckAgainstReference(
            [&](SegmentTypes t, absl::Span<const Segment> s, const CpuExec& e) {
              return SgdStepCpu(h, t, s, e);
            },
            [&](double& w, double& m, double&, double g) {
              const double m_in = m;
              SgdReference(h, w, m, g);
              if (momentum == 0.0f) m = m_in;  // the buffer is not touched without momentum
              return true;
            },
            false);
      }
    }
  }
}

TEST(CpuLion, MatchesFloat64Reference) {
  LionHyper h;
  h.lr = 1e-3f;
  h.beta1 = 0.9f;
  h.beta2 = 0.99f;
  h.weight_decay = 0.1f;
  h.common.grad_scale = 0.25f;
  CheckAgainstReference(
      [&](SegmentTypes t, absl::Span<const Segment> s, const CpuExec& e) {
        return LionStepCpu(h, t, s, e);
      },
      [&](double& w, double& m, double&, double g) {
        g *= h.common.grad_scale;
        const double c = h.beta1 * m + (1.0 - h.beta1) * g;
        w = w * (1.0 - double{h.lr} * h.weight_decay) - h.lr * ((c > 0) - (c < 0));
        m = h.beta2 * m + (1.0 - h.beta2) * g;
        return std::fabs(c) > 1e-6;  // fp32 and fp64 may disagree on the sign of a near-zero
      },
      false);
}

// A full LAMB step: update pass, norms per segment (each segment is one param here), trust
// ratios, apply pass, against float64.
TEST(CpuLamb, FullStepMatchesFloat64Reference) {
  LambHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.01f;
  h.step = 2;
  h.common.grad_scale = 0.5f;
  auto run = [&](SegmentTypes types, absl::Span<const Segment> segments, const CpuExec& exec) {
    std::vector<std::vector<float>> update_storage;
    std::vector<float*> updates;
    std::vector<ConstSpan> weight_spans, update_spans;
    for (const Segment& s : segments) {
      update_storage.emplace_back(s.numel, NAN);  // poisoned
      updates.push_back(update_storage.back().data());
    }
    ZERO_RETURN_IF_ERROR(LambUpdateCpu(h, types, segments, updates, exec));
    for (size_t i = 0; i < segments.size(); ++i) {
      weight_spans.push_back({segments[i].master, segments[i].numel});
      update_spans.push_back({updates[i], segments[i].numel});
    }
    size_t bytes = 0;
    std::vector<double> w_norms(segments.size()), u_norms(segments.size());
    NormResult total;
    ZERO_RETURN_IF_ERROR(SquaredNormsCpu(nullptr, &bytes, weight_spans, DType::kFP32, {}, nullptr, exec));
    std::vector<char> workspace(bytes);
    ZERO_RETURN_IF_ERROR(SquaredNormsCpu(workspace.data(), &bytes, weight_spans, DType::kFP32,
                                         absl::MakeSpan(w_norms), &total, exec));
    ZERO_RETURN_IF_ERROR(SquaredNormsCpu(workspace.data(), &bytes, update_spans, DType::kFP32,
                                         absl::MakeSpan(u_norms), &total, exec));
    std::vector<float> ratios;
    for (size_t i = 0; i < segments.size(); ++i) ratios.push_back(LambTrustRatio(w_norms[i], u_norms[i]));
    std::vector<const float*> const_updates(updates.begin(), updates.end());
    return LambApplyCpu(h, types.param, segments, const_updates, ratios, exec);
  };
  for (base::CpuIsa isa : SupportedIsas()) {
    for (SegmentTypes types : AllTypeCombinations()) {
      for (int64_t numel : OddSizes()) {
        const std::string where = Describe(isa, types) + "/n=" + std::to_string(numel);
        std::mt19937_64 rng(numel + 99 * static_cast<int>(isa));
        SegmentStorage got(numel, types, rng);
        const SegmentStorage init = got;
        const std::vector<Segment> segments = {got.View()};
        ASSERT_THAT(run(types, segments, CpuExec{isa, 0}), IsOk()) << where;
        const testing::LambExpected want = testing::LambReference(h, init, types.grad);
        for (int64_t i = 0; i < numel; ++i) {
          ExpectNear(got.master[i], want.weight[i], 5e-7, "weight", i, where);
          ExpectNear(got.state0[i], want.m[i], 5e-8, "exp_avg", i, where);
          ExpectNear(got.state1[i], want.v[i], 1e-9, "exp_avg_sq", i, where);
          if (types.param != DType::kFP32) {
            ASSERT_EQ(got.model_param[i], ToLowPrecision(got.master[i], types.param)) << where;
          }
        }
      }
    }
  }
}

TEST(CpuLamb, TrustRatioIsOneWhenANormIsZero) {
  EXPECT_EQ(LambTrustRatio(0.0, 4.0), 1.0f);
  EXPECT_EQ(LambTrustRatio(4.0, 0.0), 1.0f);
  EXPECT_FLOAT_EQ(LambTrustRatio(16.0, 4.0), 2.0f);
}

// With the overflow flag set, no byte of any array changes, for every optimizer.
TEST(CpuOptimizers, SkipFlagModifiesNothing) {
  const int32_t skip = 1;
  for (SegmentTypes types : AllTypeCombinations()) {
    std::mt19937_64 rng(7);
    SegmentStorage storage(1000, types, rng);
    const SegmentStorage before = storage;
    const std::vector<Segment> segments = {storage.View()};
    std::vector<float> update(1000, 1.0f);
    std::vector<float*> updates = {update.data()};
    std::vector<const float*> const_updates = {update.data()};
    const std::vector<float> ratios = {1.0f};
    AdamHyper adam;
    adam.common.skip = &skip;
    SgdHyper sgd;
    sgd.momentum = 0.9f;
    sgd.common.skip = &skip;
    LionHyper lion;
    lion.common.skip = &skip;
    LambHyper lamb;
    lamb.common.skip = &skip;
    ASSERT_THAT(AdamStepCpu(adam, types, segments, {}), IsOk());
    ASSERT_THAT(SgdStepCpu(sgd, types, segments, {}), IsOk());
    ASSERT_THAT(LionStepCpu(lion, types, segments, {}), IsOk());
    ASSERT_THAT(LambUpdateCpu(lamb, types, segments, updates, {}), IsOk());
    ASSERT_THAT(LambApplyCpu(lamb, types.param, segments, const_updates, ratios, {}), IsOk());
    EXPECT_EQ(storage.master, before.master);
    EXPECT_EQ(storage.state0, before.state0);
    EXPECT_EQ(storage.state1, before.state1);
    EXPECT_EQ(storage.model_param, before.model_param);
    EXPECT_EQ(update, std::vector<float>(1000, 1.0f));
  }
}

// A gradient scale read from memory (StepCommon::grad_scale_at) gives the bits of the same
// scale passed by value, and wins over the value, for every optimizer.
TEST(CpuOptimizers, GradScaleAtIsReadInsteadOfGradScale) {
  const float scale = 0.37f;
  for (SegmentTypes types : AllTypeCombinations()) {
    std::mt19937_64 rng(11);
    const SegmentStorage init(1001, types, rng);
    auto run = [&](bool from_memory) {
      SegmentStorage storage = init;
      const std::vector<Segment> segments = {storage.View()};
      std::vector<float> update(1001, 0.0f);
      std::vector<float*> updates = {update.data()};
      StepCommon common;
      common.grad_scale = from_memory ? 5.0f : scale;  // ignored when grad_scale_at is set
      common.grad_scale_at = from_memory ? &scale : nullptr;
      AdamHyper adam;
      adam.common = common;
      SgdHyper sgd;
      sgd.momentum = 0.9f;
      sgd.common = common;
      LionHyper lion;
      lion.common = common;
      LambHyper lamb;
      lamb.common = common;
      EXPECT_THAT(AdamStepCpu(adam, types, segments, {}), IsOk());
      EXPECT_THAT(SgdStepCpu(sgd, types, segments, {}), IsOk());
      EXPECT_THAT(LionStepCpu(lion, types, segments, {}), IsOk());
      EXPECT_THAT(LambUpdateCpu(lamb, types, segments, updates, {}), IsOk());
      return std::make_pair(storage, update);
    };
    const auto by_value = run(false);
    const auto from_memory = run(true);
    SCOPED_TRACE(::testing::Message() << DTypeName(types.param) << " params, " << DTypeName(types.grad) << " grads");
    EXPECT_EQ(from_memory.first.master, by_value.first.master);
    EXPECT_EQ(from_memory.first.state0, by_value.first.state0);
    EXPECT_EQ(from_memory.first.state1, by_value.first.state1);
    EXPECT_EQ(from_memory.second, by_value.second);
    EXPECT_NE(from_memory.first.master, init.master);
  }
}

// Chunk boundaries depend only on sizes, so any thread count gives the same bits.
TEST(CpuOptimizers, BitIdenticalAcrossThreadCounts) {
  const AdamHyper h = TestAdam(true);
  for (base::CpuIsa isa : SupportedIsas()) {
    const SegmentTypes types = {DType::kBF16, DType::kFP32};
    std::vector<float> reference_master;
    for (int threads : {1, 2, 3, 7}) {
      std::mt19937_64 rng(5);
      SegmentStorage storage(1000003, types, rng);
      const std::vector<Segment> segments = {storage.View()};
      ASSERT_THAT(AdamStepCpu(h, types, segments, CpuExec{isa, threads}), IsOk());
      if (reference_master.empty()) {
        reference_master = storage.master;
      } else {
        ASSERT_EQ(0, std::memcmp(reference_master.data(), storage.master.data(),
                                 reference_master.size() * sizeof(float)))
            << base::CpuIsaName(isa) << " threads=" << threads;
      }
    }
  }
}

TEST(CpuOptimizers, BadArgumentsAreClearErrorsAndTouchNothing) {
  std::mt19937_64 rng(3);
  SegmentStorage storage(16, {DType::kFP32, DType::kFP32}, rng);
  const SegmentStorage before = storage;
  Segment segment = storage.View();
  AdamHyper h;

  Segment no_grad = segment;
  no_grad.grad = nullptr;
  EXPECT_THAT(AdamStepCpu(h, {}, {no_grad}, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("segment 0"), HasSubstr("grad"))));

  AdamHyper bad_beta = h;
  bad_beta.beta1 = 1.0f;
  Status s = AdamStepCpu(bad_beta, {}, {segment}, {});
  EXPECT_NE(s.message().find("beta1"), std::string::npos) << s;

  AdamHyper bad_step = h;
  bad_step.step = 0;
  EXPECT_THAT(std::string(AdamStepCpu(bad_step, {}, {segment}, {}).message()), HasSubstr("step"));

  s = AdamStepCpu(h, {DType::kBF16, DType::kFP32}, {segment}, {});
  EXPECT_NE(s.message().find("model_param"), std::string::npos) << s;

  SgdHyper nesterov;
  nesterov.nesterov = true;
  EXPECT_THAT(SgdStepCpu(nesterov, {}, {segment}, {}), StatusIs(absl::StatusCode::kInvalidArgument));

  EXPECT_THAT(AdamStepCpu(h, {}, {segment}, CpuExec{base::CpuIsa::kScalar, -1}),
              StatusIs(absl::StatusCode::kInvalidArgument));

  double partial = 0.0;  // the CUDA kernels' squares in the step
  AdamHyper squares = h;
  squares.common.grad_squares = &partial;
  EXPECT_THAT(AdamStepCpu(squares, {}, {segment}, {}),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("SquaredNormsCpu")));

  EXPECT_EQ(storage.master, before.master);
  EXPECT_EQ(storage.state0, before.state0);
  EXPECT_EQ(storage.state1, before.state1);
}

}  // namespace
}  // namespace zero::kernels
