// runtime::GradGuard on its own, arrival by arrival: a second gradient is DuplicateGradient
// naming the param (or counted under on_duplicate = "count", which learns the arrivals once
// and then calls a different count a changed graph), params without a gradient are
// UnusedParameters naming them (or zeros under on_unused = "zero"), frozen params are never
// counted. The engine-level scenarios are in guard_test.cc.
#include "runtime/grad_guard.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/status_matchers.h"

namespace zero::runtime {
namespace {

using ::testing::HasSubstr;
using zero::testing::IsOk;
using zero::testing::StatusIs;

// Three trainable params in buckets 0, 0, 1 and a frozen one.
GradGuard Guard(DuplicatePolicy on_duplicate, UnusedPolicy on_unused) {
  GuardConfig config;
  config.on_duplicate = on_duplicate;
  config.on_unused = on_unused;
  return GradGuard(config, {"fc.weight", "fc.bias", "head.weight", "embed.weight"}, {0, 0, 1, -1});
}

bool Arrives(GradGuard& guard, int param) {
  bool complete = false;
  EXPECT_THAT(guard.Arrive(param, false, &complete), IsOk()) << guard.Label(param);
  return complete;
}

TEST(GradGuard, ASecondGradientIsDuplicateGradientNamingTheParam) {
  GradGuard guard = Guard(DuplicatePolicy::kError, UnusedPolicy::kError);
  guard.BeginMicroBatch(1);
  EXPECT_TRUE(Arrives(guard, 2));
  EXPECT_TRUE(Arrives(guard, 0));
  EXPECT_EQ(guard.arrival(0), 1);
  bool complete = true;
  const Status again = guard.Arrive(0, /*bucket_launched=*/true, &complete);
  EXPECT_TRUE(IsDuplicateGradient(again)) << again;
  EXPECT_FALSE(complete);
  for (const char* part : {"fc.weight", "iteration 1", "arrivals #1 and #2", "had already been reduced",
                           "use_reentrant", "on_duplicate"}) {
    EXPECT_NE(again.message().find(part), std::string::npos) << part << " missing from: " << again;
  }
  EXPECT_TRUE(IsDuplicateGradient(guard.CheckWritable(0, false)));
  EXPECT_THAT(guard.CheckWritable(1, false), IsOk());  // not arrived yet
}

TEST(GradGuard, UnusedParamsAreNamedAndFrozenOnesNeverCount) {
  GradGuard guard = Guard(DuplicatePolicy::kError, UnusedPolicy::kError);
  guard.BeginMicroBatch(4);
  Arrives(guard, 0);
  std::vector<int> to_complete;
  const Status s = guard.AtEndBackward(/*rank=*/3, &to_complete);
  EXPECT_TRUE(IsUnusedParameters(s)) << s;
  for (const char* part : {"rank 3", "2 param(s)", "fc.bias", "head.weight", "iteration 4", "on_unused"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << part << " missing from: " << s;
  }
  EXPECT_EQ(s.message().find("embed.weight"), std::string::npos) << "a frozen param was called unused: " << s;
}

TEST(GradGuard, UnusedParamsBecomeZerosAndTheStepKnowsWhichWereUsed) {
  GradGuard guard = Guard(DuplicatePolicy::kError, UnusedPolicy::kZero);
  guard.BeginMicroBatch(1);
  Arrives(guard, 1);
  std::vector<int> to_complete;
  ASSERT_THAT(guard.AtEndBackward(0, &to_complete), IsOk());
  EXPECT_EQ(to_complete, (std::vector<int>{0, 2}));  // the unused ones, completed as zeros
  EXPECT_TRUE(guard.UsedThisStep(1));
  EXPECT_FALSE(guard.UsedThisStep(0));
  guard.BeginMicroBatch(2);  // a second micro-batch of the same step uses param 0
  Arrives(guard, 0);
  ASSERT_THAT(guard.AtEndBackward(0, &to_complete), IsOk());
  EXPECT_TRUE(guard.UsedThisStep(0));
  guard.EndStep();
  EXPECT_FALSE(guard.UsedThisStep(0));
  EXPECT_FALSE(guard.UsedThisStep(1));
}

TEST(GradGuard, CountLearnsTheArrivalsOnceThenHoldsEveryIterationToThem) {
  GradGuard guard = Guard(DuplicatePolicy::kCount, UnusedPolicy::kError);
  // Iteration 1 learns: fc.weight twice (a tied weight), the others once; nothing completes
  // before EndBackward.
  guard.BeginMicroBatch(1);
  EXPECT_FALSE(Arrives(guard, 0));
  EXPECT_FALSE(Arrives(guard, 0));
  EXPECT_FALSE(Arrives(guard, 1));
  EXPECT_FALSE(Arrives(guard, 2));
  std::vector<int> to_complete;
  ASSERT_THAT(guard.AtEndBackward(0, &to_complete), IsOk());
  EXPECT_EQ(to_complete, (std::vector<int>{0, 1, 2}));
  // Iteration 2: fc.weight completes at its second arrival, a third is a changed graph.
  guard.BeginMicroBatch(2);
  EXPECT_FALSE(Arrives(guard, 0));
  EXPECT_TRUE(Arrives(guard, 0));
  bool complete = false;
  EXPECT_THAT(guard.Arrive(0, false, &complete),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("the graph changed")));
  // Iteration 3: fc.weight arrives once only: fewer than learned, named at EndBackward.
  guard.BeginMicroBatch(3);
  Arrives(guard, 0);
  Arrives(guard, 1);
  Arrives(guard, 2);
  EXPECT_THAT(guard.AtEndBackward(0, &to_complete),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("fc.weight\" (index 0): 1 of 2")));
}

// A branch not taken in the first iteration (or since a resume) under on_unused = "zero": the
// first iteration that uses it learns its count; its bucket then waits for EndBackward.
TEST(GradGuard, CountLearnsAParamInTheFirstIterationThatUsesIt) {
  GradGuard guard = Guard(DuplicatePolicy::kCount, UnusedPolicy::kZero);
  guard.BeginMicroBatch(1);
  EXPECT_FALSE(Arrives(guard, 0));
  EXPECT_FALSE(Arrives(guard, 1));
  std::vector<int> to_complete;
  ASSERT_THAT(guard.AtEndBackward(0, &to_complete), IsOk());
  EXPECT_EQ(to_complete, (std::vector<int>{0, 1, 2}));  // head.weight unused: zeros
  guard.BeginMicroBatch(2);  // head.weight's first use: twice, learned at EndBackward
  EXPECT_FALSE(Arrives(guard, 2));
  EXPECT_TRUE(Arrives(guard, 0));  // learned in iteration 1: complete at once
  EXPECT_FALSE(Arrives(guard, 2));
  EXPECT_TRUE(Arrives(guard, 1));
  ASSERT_THAT(guard.AtEndBackward(0, &to_complete), IsOk());
  EXPECT_EQ(to_complete, (std::vector<int>{2}));
  guard.BeginMicroBatch(3);  // unused again: zeros, as before
  EXPECT_TRUE(Arrives(guard, 0));
  ASSERT_THAT(guard.AtEndBackward(0, &to_complete), IsOk());
  EXPECT_EQ(to_complete, (std::vector<int>{1, 2}));
  guard.BeginMicroBatch(4);  // now held to its learned two arrivals
  EXPECT_FALSE(Arrives(guard, 2));
  EXPECT_TRUE(Arrives(guard, 2));
  bool complete = false;
  EXPECT_THAT(guard.Arrive(2, false, &complete),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("the graph changed")));
  guard.BeginMicroBatch(5);
  Arrives(guard, 2);
  EXPECT_THAT(guard.AtEndBackward(0, &to_complete),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("head.weight\" (index 2): 1 of 2")));
}

}  // namespace
}  // namespace zero::runtime
