// The MPI communicator under mpirun: the conformance suite, and the failure cases (a rank that
// never joins a collective, ranks whose collectives disagree).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "comm/mpi/mpi_all_reduce_rounds.h"
#include "tests/comm/conformance.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"

namespace zero::comm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using zero::testing::IsOk;
using zero::testing::StatusIs;

std::unique_ptr<Communicator> NewComm(MpiOptions options = {}) {
  auto comm = CreateMpiCommunicator(nullptr, options);
  EXPECT_THAT(comm, IsOk());
  return comm.ok() ? std::move(*comm) : nullptr;
}

// Sets an environment variable for one scope and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A communicator created with environment variable `name` set to `value` (read at creation).
std::unique_ptr<Communicator> NewCommWith(const char* name, const char* value) {
  ScopedEnv forced(name, value);
  return NewComm();
}

// The default: reduce-scatter and all-reduce algorithms measured per size at creation
// (run_mpi.sh forces them for the other tests).
TEST(MpiComm, ConformanceSuite) {
  std::unique_ptr<Communicator> comm;
  {
    ScopedEnv measured("ZERO_MPI_REDUCE_SCATTER", "auto");
    ScopedEnv measured_all_reduce("ZERO_MPI_ALL_REDUCE", "auto");
    comm = NewComm();
  }
  ASSERT_NE(comm, nullptr);
  EXPECT_THAT(testing::RunConformanceSuite(*comm, /*pairwise_rounding=*/true), IsOk());
}

// mpirun on one machine (as the tests run): every rank is on this host.
TEST(MpiComm, CountsTheRanksOnThisHost) {
  std::unique_ptr<Communicator> comm = NewComm();
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->ranks_on_this_host(), comm->size());
}

// Every reduce-scatter algorithm (comm/mpi/mpi_rounds.h), forced through the environment as a
// user would, passes the whole suite: odd sizes, in place, bf16/fp16, sum and max. A larger
// case too, where the ring's point-to-point messages take the rendezvous protocol.
TEST(MpiComm, ConformanceSuiteForEveryReduceScatterAlgorithm) {
  for (const char* algorithm : {"ring", "direct", "allreduce", "native"}) {
    SCOPED_TRACE(algorithm);
    std::unique_ptr<Communicator> comm = NewCommWith("ZERO_MPI_REDUCE_SCATTER", algorithm);
    ASSERT_NE(comm, nullptr);
    EXPECT_THAT(testing::RunConformanceSuite(*comm, /*pairwise_rounding=*/true), IsOk());

    const int size = comm->size(), rank = comm->rank();
    const int64_t count = (int64_t{1} << 18) + 3;  // 1 MiB per rank and a ragged end
    std::vector<float> send(static_cast<size_t>(count * size)), recv(static_cast<size_t>(count), -1.0f);
    for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>((i * 7 + rank * 3) % 101);
    ASSERT_THAT(comm->ReduceScatter(send.data(), recv.data(), count, DType::kFP32, ReduceOp::kSum)->Wait(), IsOk());
    for (int64_t i = 0; i < count; ++i) {
      double want = 0;  // small integers: every summation order is exact
      for (int r = 0; r < size; ++r) want += static_cast<double>(((rank * count + i) * 7 + r * 3) % 101);
      ASSERT_EQ(recv[static_cast<size_t>(i)], want) << "element " << i;
    }
  }
}

// Every all-reduce algorithm (comm/mpi/mpi_all_reduce_rounds.h) passes the suite, and a
// 17 MiB all-reduce: two pieces (16 MiB is the piece size), a count that divides by no rank
// count here (uneven parts).
TEST(MpiComm, ConformanceSuiteForEveryAllReduceAlgorithm) {
  for (const char* algorithm : {"native", "direct"}) {
    SCOPED_TRACE(algorithm);
    std::unique_ptr<Communicator> comm = NewCommWith("ZERO_MPI_ALL_REDUCE", algorithm);
    ASSERT_NE(comm, nullptr);
    EXPECT_THAT(testing::RunConformanceSuite(*comm, /*pairwise_rounding=*/true), IsOk());

    const int size = comm->size(), rank = comm->rank();
    const int64_t count = (int64_t{1} << 22) + (int64_t{1} << 18) + 5;
    std::vector<float> data(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) data[static_cast<size_t>(i)] = static_cast<float>((i * 7 + rank * 3) % 101);
    ASSERT_THAT(comm->AllReduce(data.data(), data.data(), count, DType::kFP32, ReduceOp::kSum)->Wait(), IsOk());
    for (int64_t i = 0; i < count; ++i) {
      double want = 0;  // small integers: every summation order is exact
      for (int r = 0; r < size; ++r) want += static_cast<double>((i * 7 + r * 3) % 101);
      ASSERT_EQ(data[static_cast<size_t>(i)], want) << "element " << i;
    }
  }
}

// Native all-reduces over 16 MiB run as several MPI_Iallreduce calls; with other collectives
// submitted while they run, every rank must still start them in the same order.
TEST(MpiComm, OverlappingNativeAllReducesInPiecesKeepTheirOrder) {
  std::unique_ptr<Communicator> comm = NewCommWith("ZERO_MPI_ALL_REDUCE", "native");
  ASSERT_NE(comm, nullptr);
  const int size = comm->size(), rank = comm->rank();
  const int64_t large = (int64_t{1} << 22) + 7;  // two pieces
  std::vector<std::vector<float>> buffers;
  for (int k = 0; k < 3; ++k) {
    buffers.emplace_back(static_cast<size_t>(k == 1 ? 1001 : large));
    for (size_t i = 0; i < buffers[k].size(); ++i) buffers[k][i] = static_cast<float>((i + k + rank) % 17);
  }
  std::vector<WorkPtr> works;
  for (auto& buffer : buffers) {
    works.push_back(comm->AllReduce(buffer.data(), buffer.data(), static_cast<int64_t>(buffer.size()),
                                    DType::kFP32, ReduceOp::kSum));
  }
  for (WorkPtr& work : works) ASSERT_THAT(work->Wait(60), IsOk());
  for (int k = 0; k < 3; ++k) {
    for (size_t i = 0; i < buffers[k].size(); ++i) {
      double want = 0;
      for (int r = 0; r < size; ++r) want += static_cast<double>((i + k + r) % 17);
      ASSERT_EQ(buffers[k][i], want) << "all-reduce " << k << " element " << i;
    }
  }
}

// The direct all-reduce's temporaries hold the largest part of any piece: a shorter last
// piece can give a rank one more element than the first (6 ranks, rank 3, 2^23 − 1 fp32).
TEST(MpiComm, DirectAllReduceScratchFitsEveryPiece) {
  AllReduceCall call;
  call.count = (int64_t{1} << 23) - 1;
  call.size = 6;
  call.rank = 3;
  const int64_t piece_bytes = int64_t{16} << 20;
  const size_t scratch = AllReduceScratchBytes(AllReduceAlgorithm::kDirect, call, piece_bytes);
  const int64_t per_piece = piece_bytes / 4;
  for (int64_t first = 0; first < call.count; first += per_piece) {
    const int64_t piece = std::min(per_piece, call.count - first);
    const int64_t part = piece * (call.rank + 1) / call.size - piece * call.rank / call.size;
    EXPECT_GE(scratch, static_cast<size_t>((call.size - 1) * part * 4)) << "piece at " << first;
  }
}

// Ranks that were given different algorithms would run mismatched point-to-point and
// collective calls (a hang): creation fails on every rank instead, naming the variable.
TEST(MpiComm, ReduceScatterAlgorithmMustAgreeAcrossRanks) {
  // MPI may not be initialised yet (the library_init variant): mpirun's variable says.
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const int rank = world_rank != nullptr ? std::atoi(world_rank) : 0;
  StatusOr<std::unique_ptr<Communicator>> comm = absl::UnknownError("not created");
  {
    ScopedEnv differing("ZERO_MPI_REDUCE_SCATTER", rank == 0 ? "ring" : "native");
    comm = CreateMpiCommunicator(nullptr);
  }
  EXPECT_THAT(comm, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ZERO_MPI_REDUCE_SCATTER differs")));
}

TEST(MpiComm, ConformanceSuiteWithSignatureChecks) {
  auto comm = NewComm({/*check_signatures=*/true});
  ASSERT_NE(comm, nullptr);
  EXPECT_THAT(testing::RunConformanceSuite(*comm, /*pairwise_rounding=*/true), IsOk());
}

TEST(MpiComm, ARankThatNeverJoinsGivesDeadlineExceeded) {
  auto comm = NewComm();
  auto side = NewComm();  // a second channel on which the ranks meet again
  ASSERT_NE(comm, nullptr);
  ASSERT_NE(side, nullptr);
  const int last = comm->size() - 1;
  float x = 1, y = 0;
  if (comm->rank() != last) {
    EXPECT_THAT(comm->AllReduce(&x, &y, 1, DType::kFP32, ReduceOp::kSum)->Wait(0.5),
                StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("AllReduce(count=1, fp32, sum)")));
  }
  // Everyone meets again. The timeout broke the group: the ranks that timed out told the late
  // rank, so every rank's next collective fails at once (well inside its 30 s timeout) with the
  // first error, instead of waiting for its own timeout.
  ASSERT_THAT(side->Barrier()->Wait(30), IsOk());
  float ack = 0;
  const auto start = std::chrono::steady_clock::now();
  Status next = comm->AllReduce(&ack, &ack, 1, DType::kFP32, ReduceOp::kSum)->Wait(30);
  if (comm->rank() == last && next.ok()) {  // its first call matched the abandoned one
    next = comm->AllReduce(&ack, &ack, 1, DType::kFP32, ReduceOp::kSum)->Wait(30);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_THAT(next, Not(IsOk()));
  EXPECT_NE(next.message().find("did not complete within 0.5 s"), std::string::npos) << next;
  EXPECT_THAT(comm->Health(), Not(IsOk()));
  ASSERT_THAT(side->Barrier()->Wait(30), IsOk());
}

TEST(MpiComm, MismatchedCountsAreAnErrorOnEveryRank) {
  auto comm = NewComm({/*check_signatures=*/true});
  ASSERT_NE(comm, nullptr);
  const int64_t count = comm->rank() == 0 ? 3 : 4;  // rank 0 diverged
  std::vector<float> data(4 * comm->size(), 2.0f), out(4, -5.0f);
  EXPECT_THAT(comm->ReduceScatter(data.data(), out.data(), count, DType::kFP32, ReduceOp::kSum)->Wait(30),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mismatch")));
  EXPECT_EQ(out, std::vector<float>(4, -5.0f));  // nothing was written
  // The mismatch broke the group: the next collective fails at once with the first error.
  float one = 1;
  EXPECT_THAT(comm->AllReduce(&one, &one, 1, DType::kFP32, ReduceOp::kSum)->Wait(30),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("broken")));
  EXPECT_EQ(one, 1.0f);
}

// A tagged all-gather (a stage-3 unit's) is checked without check_signatures: ranks that
// gather different units of one size get an error naming both tags, not each other's values.
TEST(MpiComm, TaggedAllGathersOfOneSizeButDifferentTagsAreAnError) {
  auto comm = NewComm();
  ASSERT_NE(comm, nullptr);
  std::vector<float> mine(4, 1.0f), all(4 * comm->size(), -5.0f);
  EXPECT_THAT(comm->AllGather(mine.data(), all.data(), 4, DType::kFP32, 7)->Wait(30), IsOk());
  const int64_t tag = comm->rank() == 0 ? 3 : 4;  // rank 0 gathers another unit
  const Status diverged = comm->AllGather(mine.data(), all.data(), 4, DType::kFP32, tag)->Wait(30);
  if (comm->size() > 1) {
    EXPECT_THAT(diverged, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mismatch")));
    EXPECT_THAT(diverged, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tag=3")));
    EXPECT_THAT(diverged, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tag=4")));
  }
}

// Values (host values, a trainer's all-reduce) are tagged: of another size on each rank they
// are an error naming both sizes on every rank, and nothing is written.
TEST(MpiComm, TaggedValuesOfAnotherSizeOnEachRankAreAnError) {
  auto comm = NewComm();
  ASSERT_NE(comm, nullptr);
  if (comm->size() == 1) GTEST_SKIP() << "needs two ranks";
  const int64_t count = comm->rank() == 0 ? 3 : 5;  // a per-rank-sized trainer all-reduce
  std::vector<float> values(5, 2.0f);
  const Status diverged =
      comm->AllReduce(values.data(), values.data(), count, DType::kFP32, ReduceOp::kSum, kTrainerValuesTag)->Wait(30);
  EXPECT_THAT(diverged, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("count=3, fp32, sum, trainer values")));
  EXPECT_THAT(diverged, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("count=5, fp32, sum, trainer values")));
  EXPECT_EQ(values, std::vector<float>(5, 2.0f));
}

// A tagged collective never meets an untagged one: rank 0 alone gathering host values (a
// checkpoint's checksums) while its peers gather params ten thousand times larger used to be
// matched with them (a truncated receive; heap corruption under OpenMPI's single-copy
// transport). Now every rank waits for its timeout.
TEST(MpiComm, ATaggedCollectiveOnOneRankNeverMeetsItsPeersUntaggedOne) {
  auto comm = NewComm();
  auto side = NewComm();  // a second channel on which the ranks meet again
  ASSERT_NE(comm, nullptr);
  ASSERT_NE(side, nullptr);
  if (comm->size() == 1) GTEST_SKIP() << "needs two ranks";
  constexpr int64_t kShard = 10000;
  std::vector<float> shard(kShard, 1.0f), params(kShard * comm->size(), -5.0f);
  const int64_t checksum = 42;
  std::vector<int64_t> checksums(comm->size(), -5);
  Status outcome;
  if (comm->rank() == 0) {
    outcome = comm->AllGather(&checksum, checksums.data(), 1, DType::kInt64, kHostValuesTag)->Wait(0.5);
  } else {
    outcome = comm->AllGather(shard.data(), params.data(), kShard, DType::kFP32)->Wait(0.5);
  }
  // Its own timeout, or a peer's notice of it (it breaks every rank's group): never an MPI error.
  EXPECT_THAT(outcome.code(), ::testing::AnyOf(absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kAborted))
      << outcome;
  EXPECT_NE(outcome.message().find("did not complete within 0.5 s"), std::string::npos) << outcome;
  // Rank 0's values are untouched (the peers' params may hold what the others sent each other:
  // MPI cannot take back a collective that started).
  EXPECT_EQ(checksums, std::vector<int64_t>(comm->size(), -5));
  ASSERT_THAT(side->Barrier()->Wait(30), IsOk());
}

// With check_signatures every collective's signature is checked where the tagged ones' are, so
// a rank whose collective is tagged where a peer's is not is named too (they run on different
// MPI communicators, and would otherwise both wait for their timeout).
TEST(MpiComm, SignatureChecksNameATaggedCollectiveAgainstAnUntaggedOne) {
  auto comm = NewComm({/*check_signatures=*/true});
  ASSERT_NE(comm, nullptr);
  if (comm->size() == 1) GTEST_SKIP() << "needs two ranks";
  float value = 1.0f;
  const int64_t tag = comm->rank() == 0 ? kHostValuesTag : -1;
  const Status diverged = comm->AllReduce(&value, &value, 1, DType::kFP32, ReduceOp::kSum, tag)->Wait(30);
  EXPECT_THAT(diverged, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mismatch")));
  EXPECT_THAT(diverged, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host values")));
  EXPECT_EQ(value, 1.0f);
}

// Untagged collectives of another size on each rank (ranks that diverged where nothing checks
// them) are an error, never MPI's default abort of the job (MPI_ERRORS_ARE_FATAL on
// MPI_COMM_WORLD, where OpenMPI reports a failed request). Rank 0's receive is truncated; a
// peer's longer receive may complete, but the group is broken for every rank from then on.
// Where the host program initialised MPI, its error handler is its own: the test runs where
// ZeroRT initialises it.
TEST(MpiComm, UntaggedCollectivesOfAnotherSizeOnEachRankAreAnErrorNotAnAbort) {
  if (ZERO_TEST_INIT_MPI) GTEST_SKIP() << "the host program's MPI error handler applies";
  auto comm = NewComm();
  ASSERT_NE(comm, nullptr);
  if (comm->size() == 1) GTEST_SKIP() << "needs two ranks";
  const int64_t count = comm->rank() == 0 ? 1 : 1000;
  std::vector<float> mine(1000, 1.0f), all(1000 * comm->size(), -5.0f);
  const Status diverged = comm->AllGather(mine.data(), all.data(), count, DType::kFP32)->Wait(5);
  if (comm->rank() == 0) {
    EXPECT_THAT(diverged, StatusIs(absl::StatusCode::kInternal, HasSubstr("MPI_ERR_TRUNCATE")));
    EXPECT_THAT(diverged, StatusIs(absl::StatusCode::kInternal, HasSubstr("diverged")));
  }
  EXPECT_THAT(comm->Barrier()->Wait(5), Not(IsOk()));
}

TEST(MpiComm, InvalidArgumentsAreReportedWithoutCallingMpi) {
  auto comm = NewComm();
  ASSERT_NE(comm, nullptr);
  EXPECT_THAT(comm->AllReduce(nullptr, nullptr, 4, DType::kFP32, ReduceOp::kSum)->Wait(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  float x = 0;
  EXPECT_THAT(comm->Broadcast(&x, 1, DType::kFP32, comm->size())->Wait(), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace zero::comm
