// The engine's protocol: calls out of order are clear errors that lose nothing; SetStream is for
// CUDA engines and outside iterations; an exhausted gradient-buffer pool names what it waits for.
#include <gtest/gtest.h>

#include <vector>

#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::IsOk;
using testing::StatusIs;
using testing::ToyConfig;

TEST(EngineProtocol, CallsOutOfOrderAreClearErrorsAndLoseNothing) {
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(ToyConfig(2), *(*group)[0]);
  ASSERT_THAT(engine, IsOk());
  Engine& e = **engine;
  EXPECT_THAT(e.Step(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(e.BeginIteration(), StatusIs(absl::StatusCode::kFailedPrecondition));
  const ParamId a = *e.RegisterParam({"a", {10}});
  const ParamId b = *e.RegisterParam({"b", {3, 3}});
  EXPECT_THAT(e.RegisterParam({"a", {4}}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(e.RegisterParam({"bad", {0}}), StatusIs(absl::StatusCode::kInvalidArgument));
  // A shape whose element count would wrap around int64 (to 4 here) is refused, not trained.
  EXPECT_THAT(e.RegisterParam({"huge", {(int64_t{1} << 62) + 1, 4}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than 2^40 elements")));
  EXPECT_THAT(e.RegisterParam({"counter", {4}, DType::kInt64, false}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int64")));
  ASSERT_THAT(e.Finalize(), IsOk());
  EXPECT_THAT(e.RegisterParam({"late", {4}}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(e.GradReady(a), StatusIs(absl::StatusCode::kFailedPrecondition));  // before BeginIteration
  EXPECT_THAT(e.Step(), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(e.BeginIteration(), IsOk());
  EXPECT_THAT(e.GradReady(99), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(e.GradReady(a), IsOk());
  const Status twice = e.GradReady(a);
  EXPECT_TRUE(IsDuplicateGradient(twice)) << twice;
  EXPECT_NE(twice.message().find("\"a\""), std::string::npos) << twice;
  EXPECT_THAT(e.BeginIteration(),  // names the param it waits for
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("\"b\"")));
  const Status unused = e.EndBackward();
  EXPECT_TRUE(IsUnusedParameters(unused)) << unused;
  EXPECT_NE(unused.message().find("\"b\" (index 1)"), std::string::npos) << unused;
  // Recoverable: mark the missing param and finish.
  ASSERT_THAT(e.GradReady(b), IsOk());
  ASSERT_THAT(e.EndBackward(), IsOk());
  EXPECT_THAT(e.Step(), IsOk());
}

TEST(EngineProtocol, SetStreamIsForCudaEnginesAndOutsideIterations) {
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(ToyConfig(1), *(*group)[0]);
  ASSERT_THAT(engine, IsOk());
  Engine& e = **engine;
  ASSERT_THAT(e.RegisterParam({"a", {4}}), IsOk());
  ASSERT_THAT(e.Finalize(), IsOk());
  EXPECT_THAT(e.SetStream(nullptr), IsOk());
  int not_a_stream = 0;
  EXPECT_THAT(e.SetStream(&not_a_stream), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"cuda\"")));
  ASSERT_THAT(e.BeginIteration(), IsOk());
  EXPECT_THAT(e.SetStream(nullptr), StatusIs(absl::StatusCode::kFailedPrecondition));
}

// Buckets launch in one order; a bucket first in it whose params get no gradient (a module
// the forward left out) holds every later one back, with its buffer, until none is left. The
// error names the params it waits for and the ways out, not only "gradients far from backward
// order".
TEST(EngineProtocol, AnExhaustedBufferPoolNamesTheParamsItsFirstBucketWaitsFor) {
  auto group = comm::CreateLocalGroup(1);
  Config config = ToyConfig(2);
  config.buckets.first_bucket_elems = config.buckets.reduce_bucket_elems = 128;
  config.buckets.pool_buffers = 1;
  auto engine = Engine::Create(config, *(*group)[0]);
  ASSERT_THAT(engine, IsOk());
  Engine& e = **engine;
  const ParamId used0 = *e.RegisterParam({"used0", {128}});
  const ParamId used1 = *e.RegisterParam({"used1", {128}});
  ASSERT_THAT(e.RegisterParam({"pooler.weight", {128}}), IsOk());  // last: its bucket launches first
  ASSERT_THAT(e.Finalize(), IsOk());
  ASSERT_THAT(e.BeginIteration(), IsOk());
  const std::vector<float> grad(128, 0.5f);
  ASSERT_THAT(e.AccumulateGrad(used1, grad.data()), IsOk());
  EXPECT_THAT(e.AccumulateGrad(used0, grad.data()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("\"pooler.weight\" (index 2)"), HasSubstr("no gradient"),
                                        HasSubstr("guard.on_unused"), HasSubstr("buckets.pool_buffers"))));
}

// The same pool with guard.on_unused = "zero" already set: the error does not suggest it.
TEST(EngineProtocol, AnExhaustedBufferPoolUnderOnUnusedZeroSaysWhereItMarks) {
  auto group = comm::CreateLocalGroup(1);
  Config config = ToyConfig(2);
  config.buckets.first_bucket_elems = config.buckets.reduce_bucket_elems = 128;
  config.buckets.pool_buffers = 1;
  config.guard.on_unused = UnusedPolicy::kZero;
  auto engine = Engine::Create(config, *(*group)[0]);
  ASSERT_THAT(engine, IsOk());
  Engine& e = **engine;
  const ParamId used0 = *e.RegisterParam({"used0", {128}});
  const ParamId used1 = *e.RegisterParam({"used1", {128}});
  ASSERT_THAT(e.RegisterParam({"pooler.weight", {128}}), IsOk());
  ASSERT_THAT(e.Finalize(), IsOk());
  ASSERT_THAT(e.BeginIteration(), IsOk());
  const std::vector<float> grad(128, 0.5f);
  ASSERT_THAT(e.AccumulateGrad(used1, grad.data()), IsOk());
  EXPECT_THAT(e.AccumulateGrad(used0, grad.data()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("\"pooler.weight\" (index 2)"),
                                        HasSubstr("only where the autograd graph tells"),
                                        Not(HasSubstr("set guard.on_unused")))));
}

// The bucket asking for a buffer is the one next to launch: the param whose gradient is being
// written is not among those that "had no gradient"; the gradients came far from backward order.
TEST(EngineProtocol, AnExhaustedBufferPoolDoesNotBlameTheGradientArrivingNow) {
  auto group = comm::CreateLocalGroup(1);
  Config config = ToyConfig(2);
  config.buckets.first_bucket_elems = config.buckets.reduce_bucket_elems = 128;
  config.buckets.pool_buffers = 1;
  auto engine = Engine::Create(config, *(*group)[0]);
  ASSERT_THAT(engine, IsOk());
  Engine& e = **engine;
  const ParamId early = *e.RegisterParam({"early", {128}});
  const ParamId late = *e.RegisterParam({"late", {128}});  // its bucket launches first
  ASSERT_THAT(e.Finalize(), IsOk());
  ASSERT_THAT(e.BeginIteration(), IsOk());
  const std::vector<float> grad(128, 0.5f);
  ASSERT_THAT(e.AccumulateGrad(early, grad.data()), IsOk());
  EXPECT_THAT(e.AccumulateGrad(late, grad.data()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("far from backward order"), Not(HasSubstr("\"late\"")))));
}

}  // namespace
}  // namespace zero
