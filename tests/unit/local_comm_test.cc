// The local (threads-as-ranks) communicator: the conformance suite at 1-5 ranks, bit-identical
// reduce-scatter and all-reduce, and the failure cases: a rank that never joins, mismatched
// collectives, invalid arguments; a failed collective breaks the group (fail fast, buffers of
// returned calls never touched, abandoned works), stressed with random delays and timeouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include "tests/comm/conformance.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"

namespace zero::comm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Matcher;
using ::testing::Not;
using testing::IsOk;
using testing::StatusIs;

// Runs body(comm) on every rank of a fresh local group, one thread per rank, and returns each
// rank's status.
std::vector<Status> OnEveryRank(int size, const std::function<Status(Communicator&)>& body) {
  return testing::RunOnRanks(size, [&](int, Communicator& comm) { return body(comm); });
}

class LocalConformance : public ::testing::TestWithParam<int> {};

TEST_P(LocalConformance, EveryCollectiveDtypeAndSizeMatchesFloat64) {
  const auto results = OnEveryRank(GetParam(), [](Communicator& comm) {
    return testing::RunConformanceSuite(comm, /*pairwise_rounding=*/false);
  });
  EXPECT_THAT(results, ::testing::Each(IsOk()));
}

INSTANTIATE_TEST_SUITE_P(Ranks, LocalConformance, ::testing::Values(1, 2, 3, 4, 5));

TEST(LocalComm, EveryRankSharesThisHost) {
  const auto results = OnEveryRank(3, [](Communicator& comm) {
    return comm.ranks_on_this_host() == 3
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat("ranks_on_this_host() = ", comm.ranks_on_this_host()));
  });
  EXPECT_THAT(results, ::testing::Each(IsOk()));
}

TEST(LocalComm, ReduceScatterAndAllReduceGiveIdenticalBits) {
  constexpr int kRanks = 3;
  constexpr int64_t kChunk = 1001;
  std::vector<std::vector<float>> all_reduced(kRanks), scattered(kRanks);
  OnEveryRank(kRanks, [&](Communicator& comm) {
    std::vector<float> data(kRanks * kChunk);
    for (size_t i = 0; i < data.size(); ++i) data[i] = std::sin(0.37f * i + comm.rank()) * 1e3f;
    all_reduced[comm.rank()].resize(data.size());
    scattered[comm.rank()].resize(kChunk);
    ZERO_RETURN_IF_ERROR(comm.AllReduce(data.data(), all_reduced[comm.rank()].data(), data.size(),
                                        DType::kFP32, ReduceOp::kSum)
                             ->Wait());
    return comm.ReduceScatter(data.data(), scattered[comm.rank()].data(), kChunk, DType::kFP32,
                              ReduceOp::kSum)
        ->Wait();
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(0, std::memcmp(scattered[r].data(), all_reduced[0].data() + r * kChunk,
                             kChunk * sizeof(float)));
  }
}

TEST(LocalComm, ARankThatNeverJoinsGivesDeadlineExceededNamingIt) {
  auto group = CreateLocalGroup(3);
  ASSERT_THAT(group, IsOk());
  float x = 1, y = 0;
  WorkPtr w0 = (*group)[0]->AllReduce(&x, &y, 1, DType::kFP32, ReduceOp::kSum);
  float x1 = 1, y1 = 0;
  WorkPtr w1 = (*group)[1]->AllReduce(&x1, &y1, 1, DType::kFP32, ReduceOp::kSum);
  const Status status = w0->Wait(0.2);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded,
                               AllOf(HasSubstr("rank(s) 2 never joined"), HasSubstr("AllReduce(count=1"))));
  // The timeout broke the group: rank 1's collective fails with the same first error.
  ASSERT_TRUE(w1->Test());
  EXPECT_EQ(w1->Wait(0.2), status);
}

TEST(LocalComm, AfterATimeoutEveryRanksNextCallFailsFastWithTheFirstError) {
  auto group = CreateLocalGroup(3);
  ASSERT_THAT(group, IsOk());
  float x = 1, y = 0;
  const Status first = (*group)[0]->AllReduce(&x, &y, 1, DType::kFP32, ReduceOp::kSum)->Wait(0.05);
  ASSERT_THAT(first, StatusIs(absl::StatusCode::kDeadlineExceeded));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ((*group)[r]->Health(), first) << "rank " << r;
    std::vector<float> send(3, 2.0f), recv(1, -9.0f);
    const auto start = std::chrono::steady_clock::now();
    const Status next = (*group)[r]->ReduceScatter(send.data(), recv.data(), 1, DType::kFP32, ReduceOp::kSum)->Wait(30);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
    EXPECT_THAT(next, StatusIs(absl::StatusCode::kDeadlineExceeded,
                               AllOf(HasSubstr("broken"), HasSubstr("on rank 0"))));  // where it failed
    EXPECT_EQ(recv[0], -9.0f);  // never touched
  }
}

TEST(LocalComm, ALateRankNeverTouchesTheBuffersOfARankThatTimedOut) {
  auto group = CreateLocalGroup(2);
  ASSERT_THAT(group, IsOk());
  {
    auto send = std::make_unique<std::vector<float>>(64, 1.0f);
    auto recv = std::make_unique<std::vector<float>>(32, 0.0f);
    EXPECT_THAT((*group)[0]->ReduceScatter(send->data(), recv->data(), 32, DType::kFP32, ReduceOp::kSum)->Wait(0.01),
                Not(IsOk()));
  }  // rank 0's buffers are freed here: AddressSanitizer reports any later use
  std::vector<float> send(64, 1.0f), recv(32, -3.0f);
  EXPECT_THAT((*group)[1]->ReduceScatter(send.data(), recv.data(), 32, DType::kFP32, ReduceOp::kSum)->Wait(),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(recv, std::vector<float>(32, -3.0f));
}

TEST(LocalComm, DestroyingAnUnfinishedWorkAbandonsItWithoutBlocking) {
  auto group = CreateLocalGroup(2);
  ASSERT_THAT(group, IsOk());
  {
    std::vector<float> mine(8, 1.0f);
    WorkPtr abandoned = (*group)[0]->AllReduce(mine.data(), mine.data(), 8, DType::kFP32, ReduceOp::kSum);
  }  // destroyed unfinished; its buffer freed right after
  std::vector<float> theirs(8, 5.0f);
  EXPECT_THAT((*group)[1]->AllReduce(theirs.data(), theirs.data(), 8, DType::kFP32, ReduceOp::kSum)->Wait(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("abandoned by rank 0")));
  EXPECT_EQ(theirs, std::vector<float>(8, 5.0f));
}

// Many rounds of collectives with random per-rank delays and random (often tiny) timeouts; each
// rank frees its buffers as soon as its Wait returns. Every rank must end with an error or with
// the right sum, no two ranks may disagree on a collective that completed, and AddressSanitizer
// must see no use of freed memory.
TEST(LocalComm, RandomDelaysAndTimeoutsNeverTouchFreedBuffers) {
  constexpr int kRounds = 200, kRanks = 3, kCollectives = 6;
  std::mt19937 seeds(20261122);
  int failed_rounds = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<int> completed(kRanks, 0);
    std::vector<Status> first_error(kRanks);
    std::vector<uint32_t> rank_seeds(kRanks);
    for (auto& seed : rank_seeds) seed = seeds();
    testing::RunOnRanks(kRanks, [&](int r, Communicator& comm) {
      std::mt19937 random(rank_seeds[r]);
      for (int k = 0; k < kCollectives; ++k) {
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 3000));
        const double timeout = (random() % 4 == 0) ? 1e-6 * (1 + random() % 2000) : 5.0;
        auto data = std::make_unique<std::vector<float>>(kRanks * 257, static_cast<float>(r + 1));
        auto out = std::make_unique<std::vector<float>>(257, -1.0f);
        const Status s = comm.ReduceScatter(data->data(), out->data(), 257, DType::kFP32, ReduceOp::kSum)
                             ->Wait(timeout);
        if (!s.ok()) {
          first_error[r] = s;
          return;
        }
        if ((*out)[0] != kRanks * (kRanks + 1) / 2.0f) {
          first_error[r] = absl::InternalError("wrong sum");
          return;
        }
        ++completed[r];
      }
    });
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_THAT(first_error[r], Not(StatusIs(absl::StatusCode::kInternal)));
      // A collective completes on every rank or on none: ranks that stopped early agree.
      if (!first_error[r].ok()) {
        EXPECT_EQ(completed[r], completed[0]) << "round " << round;
      }
    }
    const bool any_failed = std::any_of(first_error.begin(), first_error.end(), [](const Status& s) { return !s.ok(); });
    const Matcher<const Status&> agrees = any_failed ? Matcher<const Status&>(Not(IsOk())) : IsOk();
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_THAT(first_error[r], agrees) << "round " << round << ": rank " << r;
    }
    failed_rounds += any_failed ? 1 : 0;
  }
  // The random schedule exercised both outcomes.
  EXPECT_GT(failed_rounds, kRounds / 10);
  EXPECT_LT(failed_rounds, kRounds);
}

TEST(LocalComm, MismatchedCountsFailOnEveryRankWithoutTouchingBuffers) {
  const auto results = OnEveryRank(3, [](Communicator& comm) {
    const int64_t count = comm.rank() == 1 ? 5 : 4;  // rank 1 diverged
    std::vector<float> send(3 * 5, 1.0f), recv(5, -7.0f);
    Status s = comm.ReduceScatter(send.data(), recv.data(), count, DType::kFP32, ReduceOp::kSum)->Wait(5.0);
    for (float v : recv) {
      if (v != -7.0f) return absl::InternalError("a buffer was written despite the mismatch");
    }
    return s;
  });
  EXPECT_THAT(results, ::testing::Each(StatusIs(absl::StatusCode::kInvalidArgument,
                                                AllOf(HasSubstr("mismatch"), HasSubstr("count=5")))));
}

TEST(LocalComm, OneRanksInvalidCallFailsTheCollectiveEverywhere) {
  const auto results = OnEveryRank(2, [](Communicator& comm) {
    std::vector<float> data(4, 1.0f);
    float* buffer = comm.rank() == 0 ? nullptr : data.data();
    return comm.AllReduce(buffer, buffer, 4, DType::kFP32, ReduceOp::kSum)->Wait(5.0);
  });
  EXPECT_THAT(results, ::testing::Each(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 0"))));
  EXPECT_THAT(CreateLocalGroup(0), StatusIs(absl::StatusCode::kInvalidArgument));
}

// A group of more threads than a process should run is refused before anything is built (one
// of 2^30 ranks grew memory until the kernel killed the process).
TEST(LocalComm, AGroupLargerThanTheLimitIsRefusedAtOnce) {
  EXPECT_THAT(CreateLocalGroup(1 << 30), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 to 4096")));
  EXPECT_THAT(CreateLocalGroup(kMaxLocalGroupSize + 1), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LocalComm, BroadcastRootOutOfRangeIsAnError) {
  const auto results = OnEveryRank(2, [](Communicator& comm) {
    float x = 0;
    return comm.Broadcast(&x, 1, DType::kFP32, 2)->Wait(5.0);
  });
  EXPECT_THAT(results, ::testing::Each(StatusIs(absl::StatusCode::kInvalidArgument)));
}

}  // namespace
}  // namespace zero::comm
