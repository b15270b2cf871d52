// The engine's protocol: calls out of order are clear errors that lose nothing; SetStream is for
// CUDA engines and outside iterations.
#include <gtest/gtest.h>

#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::HasSubstr;
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

}  // namespace
}  // namespace zero
