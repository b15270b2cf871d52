// The engine's protocol: calls out of order are clear errors that lose nothing; SetStream is for
// CUDA engines and outside iterations.
#include <gtest/gtest.h>

#include "tests/engine/toy_trainer.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using testing::ToyConfig;

TEST(EngineProtocol, CallsOutOfOrderAreClearErrorsAndLoseNothing) {
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(ToyConfig(2), *(*group)[0]);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  EXPECT_EQ(e.Step().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.BeginIteration().code(), absl::StatusCode::kFailedPrecondition);
  const ParamId a = *e.RegisterParam({"a", {10}});
  const ParamId b = *e.RegisterParam({"b", {3, 3}});
  EXPECT_EQ(e.RegisterParam({"a", {4}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.RegisterParam({"bad", {0}}).status().code(), absl::StatusCode::kInvalidArgument);
  const Status integer = e.RegisterParam({"counter", {4}, DType::kInt64, false}).status();
  EXPECT_EQ(integer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(integer.message().find("int64"), std::string::npos) << integer;
  ASSERT_TRUE(e.Finalize().ok());
  EXPECT_EQ(e.RegisterParam({"late", {4}}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.GradReady(a).code(), absl::StatusCode::kFailedPrecondition);  // before BeginIteration
  EXPECT_EQ(e.Step().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e.BeginIteration().ok());
  EXPECT_EQ(e.GradReady(99).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(e.GradReady(a).ok());
  const Status twice = e.GradReady(a);
  EXPECT_TRUE(IsDuplicateGradient(twice)) << twice;
  EXPECT_NE(twice.message().find("\"a\""), std::string::npos) << twice;
  const Status begun = e.BeginIteration();
  EXPECT_EQ(begun.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(begun.message().find("\"b\""), std::string::npos) << begun;  // the param it waits for
  const Status unused = e.EndBackward();
  EXPECT_TRUE(IsUnusedParameters(unused)) << unused;
  EXPECT_NE(unused.message().find("\"b\" (index 1)"), std::string::npos) << unused;
  // Recoverable: mark the missing param and finish.
  ASSERT_TRUE(e.GradReady(b).ok());
  ASSERT_TRUE(e.EndBackward().ok());
  EXPECT_TRUE(e.Step().ok());
}

TEST(EngineProtocol, SetStreamIsForCudaEnginesAndOutsideIterations) {
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(ToyConfig(1), *(*group)[0]);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  ASSERT_TRUE(e.RegisterParam({"a", {4}}).ok());
  ASSERT_TRUE(e.Finalize().ok());
  EXPECT_TRUE(e.SetStream(nullptr).ok());
  int not_a_stream = 0;
  const Status cpu = e.SetStream(&not_a_stream);
  EXPECT_EQ(cpu.code(), absl::StatusCode::kInvalidArgument) << cpu;
  EXPECT_NE(cpu.message().find("\"cuda\""), std::string::npos) << cpu;
  ASSERT_TRUE(e.BeginIteration().ok());
  EXPECT_EQ(e.SetStream(nullptr).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace zero
