// The engine's protocol: calls out of order are clear errors that lose nothing; SetStream is for
// CUDA engines and outside iterations; a gradient-buffer pool that runs short grows, or (with
// buckets.grow_pool false) names what it waits for; stage 3 warns about params registered
// without a unit.
#include <gtest/gtest.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::AllOf;
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
  EXPECT_THAT(e.RegisterParam({"a", {4}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"a\" is already registered")));
  EXPECT_THAT(e.RegisterParam({"bad", {0}}), StatusIs(absl::StatusCode::kInvalidArgument));
  // Refused at once (Finalize refused it, when registrations could no longer be undone).
  EXPECT_THAT(e.RegisterParam({"", {4}}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty name")));
  EXPECT_THAT(e.RegisterParam({"bad\xff\xfename", {4}}),  // a checkpoint's meta.json could not hold it
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not UTF-8")));
  EXPECT_THAT(e.RegisterParam({std::string("cut\0short", 9), {4}}),  // C callers would read "cut"
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NUL byte at 3")));
  EXPECT_THAT(e.RegisterParam({"no_unit", {4}, DType::kFP32, true, 0, -5}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unit -5 is not a unit")));
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
  // The next BeginIteration says the EndBackward was refused, not that it was never called.
  EXPECT_THAT(e.BeginIteration(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                           AllOf(HasSubstr("its EndBackward() was refused"),
                                                 Not(HasSubstr("was not called")), HasSubstr("\"b\""))));
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

// An engine whose buckets each hold one of `names` (128 elements each; the last registered
// launches first) and whose pool has `pool_buffers` gradient buffers, in its first iteration.
std::unique_ptr<Engine> SmallPoolEngine(comm::Communicator& comm, Config config, const std::vector<std::string>& names,
                                        int pool_buffers) {
  config.buckets.first_bucket_elems = config.buckets.reduce_bucket_elems = 128;
  config.buckets.pool_buffers = pool_buffers;
  auto engine = Engine::Create(config, comm);
  EXPECT_THAT(engine, IsOk());
  if (!engine.ok()) return nullptr;
  for (const std::string& name : names) EXPECT_THAT((*engine)->RegisterParam({name, {128}}), IsOk());
  EXPECT_THAT((*engine)->Finalize(), IsOk());
  EXPECT_THAT((*engine)->BeginIteration(), IsOk());
  return *std::move(engine);
}

std::unique_ptr<Engine> OneBufferEngine(comm::Communicator& comm, Config config,
                                        const std::vector<std::string>& names) {
  return SmallPoolEngine(comm, std::move(config), names, 1);
}

// ToyConfig(stage) whose pool never grows: a pool that runs short fails the micro-batch.
Config FixedPoolConfig(int stage) {
  Config config = ToyConfig(stage);
  config.buckets.grow_pool = false;
  return config;
}

const std::vector<float> kGrad(128, 0.5f);

// Gradients in registration order, the reverse of the launch order: each one takes a buffer
// for a bucket that cannot launch before the later ones, so a pool of one runs short with
// nothing in flight. It grows (once per missing buffer, in the first step only) and trains
// exactly as a pool large enough from the start, at stages 2 and 3 on 3 ranks.
TEST(EngineProtocol, AShortBufferPoolGrowsAndTrainsAsALargeOne) {
  for (int stage : {2, 3}) {
    std::vector<std::vector<float>> trained(2, std::vector<float>(3 * 128));
    std::vector<int64_t> added(2);
    for (int pool : {1, 3}) {
      const auto statuses = testing::RunOnRanks(3, [&](int rank, comm::Communicator& comm) -> Status {
        auto e = SmallPoolEngine(comm, ToyConfig(stage), {"a", "b", "c"}, pool);
        if (e == nullptr) return absl::InternalError("no engine");
        for (int step = 0; step < 3; ++step) {
          if (step > 0) ZERO_RETURN_IF_ERROR(e->BeginIteration());
          for (int p = 0; p < 3; ++p) {  // "a" first: its bucket launches last
            std::vector<float> g(128);
            for (int i = 0; i < 128; ++i) g[i] = static_cast<float>((i + 5 * p + 3 * rank + step) % 7 - 3);
            ZERO_RETURN_IF_ERROR(e->AccumulateGrad(p, g.data()));
          }
          ZERO_RETURN_IF_ERROR(e->EndBackward());
          ZERO_RETURN_IF_ERROR(e->Step().status());
          if (step == 0 && rank == 0) added[pool == 1 ? 0 : 1] = e->counters().pool_buffers_added;
        }
        if (rank == 0) {
          EXPECT_EQ(e->counters().pool_buffers_added, added[pool == 1 ? 0 : 1]) << "later steps";
        }
        std::vector<float> values(3 * 128);
        for (int p = 0; p < 3; ++p) ZERO_RETURN_IF_ERROR(e->GetParam(p, values.data() + 128 * p));
        if (rank == 0) trained[pool == 1 ? 0 : 1] = values;
        return absl::OkStatus();
      });
      for (const Status& s : statuses) ASSERT_THAT(s, IsOk()) << "stage " << stage << ", pool " << pool;
    }
    EXPECT_EQ(added[0], 2) << "stage " << stage;
    EXPECT_EQ(added[1], 0) << "stage " << stage;
    EXPECT_EQ(trained[0], trained[1]) << "stage " << stage;
  }
}

// The first addition is logged once, naming the bucket that holds the launches back and its
// param that has had no gradient; under guard.on_unused = "zero" such a param (no rank's
// forward used it) completes at EndBackward and the step trains the others.
TEST(EngineProtocol, AGrownPoolIsLoggedOnceNamingWhatTheLaunchesWaitFor) {
  Config config = ToyConfig(2);
  config.guard.on_unused = UnusedPolicy::kZero;
  auto group = comm::CreateLocalGroup(1);
  auto e = OneBufferEngine(*(*group)[0], config, {"used0", "used1", "pooler.weight"});
  ASSERT_NE(e, nullptr);
  ::testing::internal::CaptureStderr();
  ASSERT_THAT(e->AccumulateGrad(1, kGrad.data()), IsOk());
  ASSERT_THAT(e->AccumulateGrad(0, kGrad.data()), IsOk());
  ASSERT_THAT(e->EndBackward(), IsOk());
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(logged, ::testing::AllOf(HasSubstr("Added one (now 2; buckets.pool_buffers = 1)"),
                                       HasSubstr("\"pooler.weight\" (index 2)"), HasSubstr("GradAbsent(id)")));
  EXPECT_EQ(logged.find("Added one"), logged.rfind("Added one")) << logged;
  EXPECT_EQ(e->counters().pool_buffers_added, 2);  // for "used0", then for "pooler.weight"'s zeros
  ASSERT_THAT(e->Step(), IsOk());
}

// Buckets launch in one order; a bucket first in it whose params get no gradient (a module
// the forward left out) holds every later one back, with its buffer, until none is left. The
// error names the params it waits for and the ways out, not only "gradients far from backward
// order".
TEST(EngineProtocol, AnExhaustedBufferPoolNamesTheParamsItsFirstBucketWaitsFor) {
  auto group = comm::CreateLocalGroup(1);
  auto e = OneBufferEngine(*(*group)[0], FixedPoolConfig(2), {"used0", "used1", "pooler.weight"});
  ASSERT_NE(e, nullptr);
  ASSERT_THAT(e->AccumulateGrad(1, kGrad.data()), IsOk());
  EXPECT_THAT(e->AccumulateGrad(0, kGrad.data()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("\"pooler.weight\" (index 2)"), HasSubstr("no gradient"),
                                        HasSubstr("guard.on_unused"), HasSubstr("buckets.pool_buffers"))));
}

// The same pool with guard.on_unused = "zero" already set: the error does not suggest it, and
// names GradAbsent, which frees the bucket of a param the trainer knows gets no gradient.
TEST(EngineProtocol, AnExhaustedBufferPoolUnderOnUnusedZeroSaysWhereItMarks) {
  Config config = FixedPoolConfig(2);
  config.guard.on_unused = UnusedPolicy::kZero;
  auto group = comm::CreateLocalGroup(1);
  auto e = OneBufferEngine(*(*group)[0], config, {"used0", "used1", "pooler.weight"});
  ASSERT_NE(e, nullptr);
  ASSERT_THAT(e->AccumulateGrad(1, kGrad.data()), IsOk());
  EXPECT_THAT(e->AccumulateGrad(0, kGrad.data()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("\"pooler.weight\" (index 2)"),
                                        HasSubstr("GradAbsent(id)"), HasSubstr("where the autograd graph tells"),
                                        Not(HasSubstr("set guard.on_unused")))));
}

// The bucket asking for a buffer is the one next to launch: the param whose gradient is being
// written is not among those that "had no gradient"; the gradients came far from backward order.
TEST(EngineProtocol, AnExhaustedBufferPoolDoesNotBlameTheGradientArrivingNow) {
  auto group = comm::CreateLocalGroup(1);
  auto e = OneBufferEngine(*(*group)[0], FixedPoolConfig(2), {"early", "late"});  // late's launches first
  ASSERT_NE(e, nullptr);
  ASSERT_THAT(e->AccumulateGrad(0, kGrad.data()), IsOk());
  EXPECT_THAT(e->AccumulateGrad(1, kGrad.data()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("far from backward order"), Not(HasSubstr("\"late\"")))));
  // No call can finish that iteration (the bucket holding the buffer launches after the one
  // that needs it), nor start another: each says so, instead of an error about unused params
  // or an unfinished iteration.
  const auto lost = StatusIs(absl::StatusCode::kFailedPrecondition,
                             ::testing::AllOf(HasSubstr("could no longer finish"), HasSubstr("far from backward order")));
  EXPECT_THAT(e->AccumulateGrad(1, kGrad.data()), lost);
  EXPECT_THAT(e->EndBackward(), lost);
  EXPECT_THAT(e->BeginIteration(), lost);
  EXPECT_THAT(e->Step(), lost);
  EXPECT_THAT(e->DropGradients(), lost);
  EXPECT_THAT(e->AbandonMicroBatch(), lost);
  EXPECT_THAT(e->LoadCheckpoint("/nonexistent"), lost);
}

// Under guard.on_unused = "zero" the same pool fails inside EndBackward (the param that got
// no gradient completes its bucket there): the micro-batch is half reduced, so a new one is
// refused rather than started beside it.
TEST(EngineProtocol, AnEndBackwardThatFailedHalfDoneLetsNoIterationFollow) {
  Config config = FixedPoolConfig(2);
  config.guard.on_unused = UnusedPolicy::kZero;
  auto group = comm::CreateLocalGroup(1);
  auto e = OneBufferEngine(*(*group)[0], config, {"early", "late"});  // late's launches first
  ASSERT_NE(e, nullptr);
  ASSERT_THAT(e->AccumulateGrad(0, kGrad.data()), IsOk());  // takes the only buffer
  EXPECT_THAT(e->EndBackward(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(e->BeginIteration(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("could no longer finish")));
  EXPECT_THAT(e->Step(), StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("could no longer finish")));
}

// A micro-batch whose backward stopped halfway (the trainer caught an exception) is
// abandoned: its missing gradients count as zeros whatever guard.on_unused says, the step's
// gradients are dropped, and the next step is as if that micro-batch never came. At every
// stage, on two ranks that both skip it.
TEST(EngineProtocol, AnAbandonedMicroBatchLeavesNothingBehind) {
  for (int stage : {0, 1, 2, 3}) {
    std::vector<std::vector<float>> trained(2);
    for (const bool abandon : {true, false}) {
      const auto statuses = testing::RunOnRanks(2, [&](int rank, comm::Communicator& comm) -> Status {
        auto e = OneBufferEngine(comm, ToyConfig(stage), {"a", "b"});
        if (e == nullptr) return absl::InternalError("no engine");
        auto hand_over = [&](int p, float scale) -> Status {
          std::vector<float> g(128);
          for (int i = 0; i < 128; ++i) g[i] = scale * static_cast<float>((i + 7 * p + rank) % 5 - 2);
          return e->AccumulateGrad(p, g.data());  // no units: gathered on every rank at stage 3
        };
        if (abandon) {
          ZERO_RETURN_IF_ERROR(hand_over(1, 100.0f));  // "a" never comes: the backward raised
          ZERO_RETURN_IF_ERROR(e->AbandonMicroBatch());
          ZERO_RETURN_IF_ERROR(e->BeginIteration());
        }
        ZERO_RETURN_IF_ERROR(hand_over(1, 1.0f));
        ZERO_RETURN_IF_ERROR(hand_over(0, 1.0f));
        ZERO_RETURN_IF_ERROR(e->EndBackward());
        ZERO_RETURN_IF_ERROR(e->Step().status());
        if (rank == 0) {
          trained[abandon ? 0 : 1].resize(256);
          for (int p = 0; p < 2; ++p) ZERO_RETURN_IF_ERROR(e->GetParam(p, trained[abandon ? 0 : 1].data() + 128 * p));
        } else {
          std::vector<float> ignored(128);
          for (int p = 0; p < 2; ++p) ZERO_RETURN_IF_ERROR(e->GetParam(p, ignored.data()));
        }
        return absl::OkStatus();
      });
      for (const Status& s : statuses) ASSERT_THAT(s, IsOk()) << "stage " << stage;
    }
    EXPECT_EQ(trained[0], trained[1]) << "stage " << stage;
  }
}

// Stage 3 keeps a param registered without a unit gathered on every rank: Finalize warns when
// most of the model is so (the C header's example registers without one).
TEST(EngineProtocol, Stage3WarnsWhenMostParamsHaveNoUnit) {
  for (const bool with_units : {false, true}) {
    auto group = comm::CreateLocalGroup(1);
    auto engine = Engine::Create(ToyConfig(3), *(*group)[0]);
    ASSERT_THAT(engine, IsOk());
    for (int p = 0; p < 3; ++p) {
      ParamSpec spec{absl::StrCat("layer", p, ".weight"), {64, 64}};
      spec.unit = with_units ? p : -1;
      ASSERT_THAT((*engine)->RegisterParam(spec), IsOk());
    }
    ::testing::internal::CaptureStderr();
    ASSERT_THAT((*engine)->Finalize(), IsOk());
    const std::string logged = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(logged.find("registered without a unit") != std::string::npos, !with_units) << logged;
  }
}

}  // namespace
}  // namespace zero
