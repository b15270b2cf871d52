// runtime::BucketScheduler on its own, with stand-in collectives: launches strictly in bucket
// order whatever order buckets become ready in, runs each Finish after its collective
// succeeded (never after a failure), and refuses calls out of order.
#include "runtime/bucket_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/status_matchers.h"

namespace zero::runtime {
namespace {

using ::testing::HasSubstr;
using ::zero::testing::IsOk;
using ::zero::testing::StatusIs;

// A collective that completes at once with a given outcome.
class DoneWork final : public comm::Work {
 public:
  explicit DoneWork(Status outcome) : outcome_(std::move(outcome)) {}
  Status Wait(double) override { return outcome_; }
  bool Test() override { return true; }

 private:
  Status outcome_;
};

struct Log {
  std::vector<std::string> events;
  BucketScheduler::Launch Launch(int bucket, Status outcome = absl::OkStatus()) {
    return [this, bucket, outcome] {
      events.push_back("launch " + std::to_string(bucket));
      return std::make_unique<DoneWork>(outcome);
    };
  }
  BucketScheduler::Finish Finish(int bucket) {
    return [this, bucket] {
      events.push_back("finish " + std::to_string(bucket));
      return absl::OkStatus();
    };
  }
};

TEST(BucketScheduler, LaunchesInBucketOrderWhateverOrderBucketsAreReadyIn) {
  Log log;
  std::vector<int> launched;
  BucketScheduler::Hooks hooks;
  hooks.on_launch = [&](int b) { launched.push_back(b); };
  BucketScheduler scheduler(4, nullptr, hooks);
  ASSERT_THAT(scheduler.MarkReady(2, log.Launch(2), log.Finish(2)), IsOk());
  ASSERT_THAT(scheduler.MarkReady(3, log.Launch(3), log.Finish(3)), IsOk());
  EXPECT_TRUE(launched.empty()) << "bucket 2 launched before buckets 0 and 1";
  ASSERT_THAT(scheduler.MarkReady(0, log.Launch(0), log.Finish(0)), IsOk());
  EXPECT_EQ(launched, (std::vector<int>{0}));
  ASSERT_THAT(scheduler.MarkReady(1, log.Launch(1), log.Finish(1)), IsOk());
  EXPECT_EQ(launched, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(scheduler.in_flight(), 4);
  ASSERT_THAT(scheduler.WaitAll(1), IsOk());
  EXPECT_EQ(log.events, (std::vector<std::string>{"launch 0", "launch 1", "launch 2", "launch 3", "finish 0",
                                                  "finish 1", "finish 2", "finish 3"}));
}

TEST(BucketScheduler, ABucketWithNothingToSendFinishesInItsTurn) {
  Log log;
  BucketScheduler scheduler(3);
  ASSERT_THAT(scheduler.MarkReady(1, nullptr, log.Finish(1)), IsOk());  // e.g. not reduced this micro-batch
  EXPECT_TRUE(log.events.empty());
  ASSERT_THAT(scheduler.MarkReady(0, log.Launch(0), log.Finish(0)), IsOk());
  ASSERT_THAT(scheduler.MarkReady(2, log.Launch(2), log.Finish(2)), IsOk());
  ASSERT_THAT(scheduler.WaitAll(1), IsOk());
  EXPECT_EQ(log.events, (std::vector<std::string>{"launch 0", "finish 1", "launch 2", "finish 0", "finish 2"}));
}

TEST(BucketScheduler, AFailedCollectiveNamesTheBucketAndSkipsItsFinish) {
  Log log;
  BucketScheduler::Hooks hooks;
  hooks.describe = [](int b) { return "bucket " + std::to_string(b) + " (fc1.weight)"; };
  BucketScheduler scheduler(2, nullptr, hooks);
  ASSERT_THAT(scheduler.MarkReady(0, log.Launch(0, absl::DeadlineExceededError("peer 2 never came")), log.Finish(0)),
              IsOk());
  EXPECT_THAT(scheduler.WaitOldest(1),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("bucket 0 (fc1.weight): peer 2 never came")));
  EXPECT_EQ(log.events, (std::vector<std::string>{"launch 0"}));
}

TEST(BucketScheduler, AFailedCheckBeforeLaunchSendsNothingAndIsTheBucketsError) {
  Log log;
  std::vector<int> checked;
  BucketScheduler::Hooks hooks;
  hooks.before_launch = [&](int b) {
    checked.push_back(b);
    return b == 1 ? absl::InvalidArgumentError("ranks disagree") : absl::OkStatus();
  };
  BucketScheduler scheduler(2, nullptr, hooks);
  ASSERT_THAT(scheduler.MarkReady(0, log.Launch(0), log.Finish(0)), IsOk());
  ASSERT_THAT(scheduler.MarkReady(1, log.Launch(1), log.Finish(1)), IsOk());
  EXPECT_THAT(scheduler.WaitOldest(1), IsOk());
  EXPECT_THAT(scheduler.WaitOldest(1), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bucket 1: ranks disagree")));
  EXPECT_EQ(checked, (std::vector<int>{0, 1}));
  EXPECT_EQ(log.events, (std::vector<std::string>{"launch 0", "finish 0"}));
}

TEST(BucketScheduler, CallsOutOfOrderAreRefused) {
  Log log;
  BucketScheduler scheduler(2);
  EXPECT_THAT(scheduler.WaitOldest(1), StatusIs(absl::StatusCode::kFailedPrecondition));  // nothing in flight
  EXPECT_THAT(scheduler.MarkReady(2, log.Launch(2), nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(scheduler.MarkReady(-1, log.Launch(0), nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(scheduler.MarkReady(0, log.Launch(0), nullptr), IsOk());
  EXPECT_THAT(scheduler.MarkReady(0, log.Launch(0), nullptr), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(scheduler.Reset(), StatusIs(absl::StatusCode::kFailedPrecondition));  // bucket 0 in flight
  ASSERT_THAT(scheduler.WaitAll(1), IsOk());
  ASSERT_THAT(scheduler.Reset(), IsOk());
  ASSERT_THAT(scheduler.MarkReady(0, log.Launch(0), nullptr), IsOk());  // a new round
  ASSERT_THAT(scheduler.WaitAll(1), IsOk());
}

}  // namespace
}  // namespace zero::runtime
