// runtime::BucketScheduler on its own, with stand-in collectives: launches strictly in bucket
// order whatever order buckets become ready in, runs each Finish after its collective
// succeeded (never after a failure), and refuses calls out of order.
#include "runtime/bucket_scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace zero::runtime {
namespace {

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
  BucketScheduler scheduler(4, [&](int b) { launched.push_back(b); });
  ASSERT_TRUE(scheduler.MarkReady(2, log.Launch(2), log.Finish(2)).ok());
  ASSERT_TRUE(scheduler.MarkReady(3, log.Launch(3), log.Finish(3)).ok());
  EXPECT_TRUE(launched.empty()) << "bucket 2 launched before buckets 0 and 1";
  ASSERT_TRUE(scheduler.MarkReady(0, log.Launch(0), log.Finish(0)).ok());
  EXPECT_EQ(launched, (std::vector<int>{0}));
  ASSERT_TRUE(scheduler.MarkReady(1, log.Launch(1), log.Finish(1)).ok());
  EXPECT_EQ(launched, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(scheduler.in_flight(), 4);
  ASSERT_TRUE(scheduler.WaitAll(1).ok());
  EXPECT_EQ(log.events, (std::vector<std::string>{"launch 0", "launch 1", "launch 2", "launch 3", "finish 0",
                                                  "finish 1", "finish 2", "finish 3"}));
}

TEST(BucketScheduler, ABucketWithNothingToSendFinishesInItsTurn) {
  Log log;
  BucketScheduler scheduler(3);
  ASSERT_TRUE(scheduler.MarkReady(1, nullptr, log.Finish(1)).ok());  // e.g. not reduced this micro-batch
  EXPECT_TRUE(log.events.empty());
  ASSERT_TRUE(scheduler.MarkReady(0, log.Launch(0), log.Finish(0)).ok());
  ASSERT_TRUE(scheduler.MarkReady(2, log.Launch(2), log.Finish(2)).ok());
  ASSERT_TRUE(scheduler.WaitAll(1).ok());
  EXPECT_EQ(log.events, (std::vector<std::string>{"launch 0", "finish 1", "launch 2", "finish 0", "finish 2"}));
}

TEST(BucketScheduler, AFailedCollectiveNamesTheBucketAndSkipsItsFinish) {
  Log log;
  BucketScheduler scheduler(2, nullptr, [](int b) { return "bucket " + std::to_string(b) + " (fc1.weight)"; });
  ASSERT_TRUE(scheduler.MarkReady(0, log.Launch(0, absl::DeadlineExceededError("peer 2 never came")),
                                  log.Finish(0)).ok());
  const Status s = scheduler.WaitOldest(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("bucket 0 (fc1.weight): peer 2 never came"), std::string::npos) << s;
  EXPECT_EQ(log.events, (std::vector<std::string>{"launch 0"}));
}

TEST(BucketScheduler, CallsOutOfOrderAreRefused) {
  Log log;
  BucketScheduler scheduler(2);
  EXPECT_EQ(scheduler.WaitOldest(1).code(), absl::StatusCode::kFailedPrecondition);  // nothing in flight
  EXPECT_EQ(scheduler.MarkReady(2, log.Launch(2), nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.MarkReady(-1, log.Launch(0), nullptr).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(scheduler.MarkReady(0, log.Launch(0), nullptr).ok());
  EXPECT_EQ(scheduler.MarkReady(0, log.Launch(0), nullptr).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(scheduler.Reset().code(), absl::StatusCode::kFailedPrecondition);  // bucket 0 in flight
  ASSERT_TRUE(scheduler.WaitAll(1).ok());
  ASSERT_TRUE(scheduler.Reset().ok());
  ASSERT_TRUE(scheduler.MarkReady(0, log.Launch(0), nullptr).ok());  // a new round
  ASSERT_TRUE(scheduler.WaitAll(1).ok());
}

}  // namespace
}  // namespace zero::runtime
