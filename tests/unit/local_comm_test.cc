// The local (threads-as-ranks) communicator: the conformance suite at 1-5 ranks, bit-identical
// reduce-scatter and all-reduce, and the failure cases: a rank that never joins, mismatched
// collectives, invalid arguments.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <thread>

#include "zero/communicator.h"
#include "tests/comm/conformance.h"

namespace zero::comm {
namespace {

// Runs body(comm) on every rank of a fresh local group, one thread per rank, and returns each
// rank's status.
std::vector<Status> OnEveryRank(int size, const std::function<Status(Communicator&)>& body) {
  auto group = CreateLocalGroup(size);
  EXPECT_TRUE(group.ok());
  std::vector<Status> results(size);
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] { results[r] = body(*(*group)[r]); });
  }
  for (auto& t : ranks) t.join();
  return results;
}

class LocalConformance : public ::testing::TestWithParam<int> {};

TEST_P(LocalConformance, EveryCollectiveDtypeAndSizeMatchesFloat64) {
  const auto results = OnEveryRank(GetParam(), [](Communicator& comm) {
    return testing::RunConformanceSuite(comm, /*pairwise_rounding=*/false);
  });
  for (size_t r = 0; r < results.size(); ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
}

INSTANTIATE_TEST_SUITE_P(Ranks, LocalConformance, ::testing::Values(1, 2, 3, 4, 5));

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
  ASSERT_TRUE(group.ok());
  float x = 1, y = 0;
  WorkPtr w0 = (*group)[0]->AllReduce(&x, &y, 1, DType::kFP32, ReduceOp::kSum);
  float x1 = 1, y1 = 0;
  WorkPtr w1 = (*group)[1]->AllReduce(&x1, &y1, 1, DType::kFP32, ReduceOp::kSum);
  const Status status = w0->Wait(0.2);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("rank(s) 2 never joined"), std::string::npos) << status;
  EXPECT_NE(status.message().find("AllReduce(count=1"), std::string::npos) << status;
  EXPECT_FALSE(w1->Test());
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
  for (const Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("mismatch"), std::string::npos) << s;
    EXPECT_NE(s.message().find("count=5"), std::string::npos) << s;
  }
}

TEST(LocalComm, OneRanksInvalidCallFailsTheCollectiveEverywhere) {
  const auto results = OnEveryRank(2, [](Communicator& comm) {
    std::vector<float> data(4, 1.0f);
    float* buffer = comm.rank() == 0 ? nullptr : data.data();
    return comm.AllReduce(buffer, buffer, 4, DType::kFP32, ReduceOp::kSum)->Wait(5.0);
  });
  for (const Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s;
  }
  auto group = CreateLocalGroup(0);
  EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalComm, BroadcastRootOutOfRangeIsAnError) {
  const auto results = OnEveryRank(2, [](Communicator& comm) {
    float x = 0;
    return comm.Broadcast(&x, 1, DType::kFP32, 2)->Wait(5.0);
  });
  for (const Status& s : results) EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace zero::comm
