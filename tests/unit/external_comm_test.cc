// The external communicator (collectives run by a table of functions): the conformance suite
// and toy training through a table over two in-process groups (one per channel), equal bit
// for bit to the in-process communicator's; tagged collectives that diverge named on every
// rank; a table that fails, a peer that never comes, abandoned works; the table's handles
// all released and its destroy called once.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tests/comm/conformance.h"
#include "tests/comm/local_table.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero::comm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::OnExternalRanks;
using testing::StatusIs;
using testing::TableLedger;
using testing::LocalTable;

class ExternalConformance : public ::testing::TestWithParam<int> {};

TEST_P(ExternalConformance, EveryCollectiveDtypeAndSizeMatchesFloat64) {
  TableLedger ledger;
  const auto results = OnExternalRanks(GetParam(), ledger, [](int, Communicator& comm) {
    return testing::RunConformanceSuite(comm, /*pairwise_rounding=*/false);
  });
  EXPECT_THAT(results, ::testing::Each(IsOk()));
  EXPECT_EQ(ledger.held, 0);
  EXPECT_EQ(ledger.destroyed, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Ranks, ExternalConformance, ::testing::Values(1, 2, 3, 5));

TEST(ExternalComm, SaysWhatItIs) {
  TableLedger ledger;
  const auto results = OnExternalRanks(3, ledger, [](int r, Communicator& comm) -> Status {
    if (comm.rank() != r || comm.size() != 3 || comm.ranks_on_this_host() != 3 ||
        std::string(comm.backend()) != "external" || !comm.Health().ok()) {
      return absl::InternalError("wrong rank, size, ranks_on_this_host, backend or health");
    }
    return absl::OkStatus();
  });
  EXPECT_THAT(results, ::testing::Each(IsOk()));
}

// The toy model trained at each stage through external communicators ends with the same bits
// as through the in-process communicator (one rounding of each sum, in rank order, in both).
TEST(ExternalComm, TrainsEveryStageBitForBitAsTheInProcessCommunicator) {
  constexpr int kWorld = 3;
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE(absl::StrCat("stage ", stage));
    const Config config = testing::ToyConfig(stage);
    testing::ToyOptions options;
    options.steps = 4;
    const std::vector<testing::RankRun> local = testing::TrainOnLocalRanks(kWorld, config, options);
    std::vector<testing::ToyResult> external(kWorld);
    TableLedger ledger;
    const auto statuses = OnExternalRanks(kWorld, ledger, [&](int r, Communicator& comm) -> Status {
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
      return testing::TrainToy(*engine, options, &external[r]);
    });
    ASSERT_THAT(statuses, ::testing::Each(IsOk()));
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(external[r].losses, local[r].result.losses) << "rank " << r;
      EXPECT_EQ(external[r].final_params, local[r].result.final_params) << "rank " << r;
    }
    EXPECT_EQ(ledger.held, 0);
  }
}

TEST(ExternalComm, TaggedCollectivesThatDivergeAreNamedOnEveryRankAndBreakTheGroup) {
  TableLedger ledger;
  const auto results = OnExternalRanks(3, ledger, [](int r, Communicator& comm) -> Status {
    std::vector<float> send(4, 1.0f), recv(12);
    const Status first = comm.AllGather(send.data(), recv.data(), 4, DType::kFP32, r == 1 ? 5 : 4)->Wait(30);
    if (first.ok()) return absl::InternalError("the diverged gather succeeded");
    const Status next = comm.AllReduce(send.data(), recv.data(), 4, DType::kFP32, ReduceOp::kSum)->Wait(30);
    if (next.ok() || comm.Health().ok()) return absl::InternalError("the group still works");
    return first;
  });
  for (const Status& status : results) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                                 AllOf(HasSubstr("collective #1 mismatch"), HasSubstr("AllGather(count=4, fp32, tag=4)"),
                                       HasSubstr("AllGather(count=4, fp32, tag=5)"))));
  }
  EXPECT_EQ(ledger.held, 0);
}

TEST(ExternalComm, ATableThatCannotStartBreaksTheGroupWithItsMessage) {
  TableLedger ledger;
  const auto results = OnExternalRanks(
      1, ledger,
      [](int, Communicator& comm) -> Status {
        std::vector<float> data(8, 2.0f);
        const Status first = comm.AllReduce(data.data(), data.data(), 8, DType::kFP32, ReduceOp::kSum)->Wait();
        ZERO_RETURN_IF_ERROR(first);
        const Status failed = comm.AllReduce(data.data(), data.data(), 8, DType::kFP32, ReduceOp::kSum)->Wait();
        if (failed.ok()) return absl::InternalError("a failed start succeeded");
        const Status broken = comm.Barrier()->Wait();
        if (broken.ok() || comm.Health().message() != failed.message()) {
          return absl::InternalError(absl::StrCat("not broken by the failure: ", broken.ToString()));
        }
        if (comm.AbandonedWorkMayTouchBuffers()) {
          return absl::InternalError("a collective that never started may touch its buffers");
        }
        return failed;
      },
      /*failing_rank=*/0, /*fail_start_at=*/2);
  EXPECT_THAT(results[0], StatusIs(absl::StatusCode::kUnavailable,
                                   AllOf(HasSubstr("AllReduce(count=8, fp32, sum) (collective #2 on channel 0"),
                                         HasSubstr("the table's transport is down"))));
}

TEST(ExternalComm, APeerThatNeverComesTimesOutAndAnAbandonedWorkBreaksTheGroup) {
  TableLedger ledger;
  const auto results = OnExternalRanks(2, ledger, [](int r, Communicator& comm) -> Status {
    if (r == 1) return absl::OkStatus();  // never joins
    std::vector<float> data(8, 1.0f);
    const Status late = comm.AllReduce(data.data(), data.data(), 8, DType::kFP32, ReduceOp::kSum)->Wait(0.2);
    if (late.code() != absl::StatusCode::kDeadlineExceeded) {
      return absl::InternalError(absl::StrCat("expected a deadline, got ", late.ToString()));
    }
    if (comm.AbandonedWorkMayTouchBuffers()) {  // the in-process group ends a timed-out one
      return absl::InternalError("a collective the table ended may touch its buffers");
    }
    return comm.Health().code() == absl::StatusCode::kDeadlineExceeded
               ? absl::OkStatus()
               : absl::InternalError("the timeout did not break the group");
  });
  EXPECT_THAT(results, ::testing::Each(IsOk()));
  EXPECT_EQ(ledger.held, 0);
  EXPECT_EQ(ledger.destroyed, 2);

  TableLedger abandoned;
  const auto dropped = OnExternalRanks(2, abandoned, [](int r, Communicator& comm) -> Status {
    if (r == 1) return absl::OkStatus();
    std::vector<float> data(8, 1.0f);
    comm.AllReduce(data.data(), data.data(), 8, DType::kFP32, ReduceOp::kSum).reset();  // never waited
    return comm.Health().code() == absl::StatusCode::kCancelled && comm.AbandonedWorkMayTouchBuffers()
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat("health after abandoning: ", comm.Health().ToString()));
  });
  EXPECT_THAT(dropped, ::testing::Each(IsOk()));
  EXPECT_EQ(abandoned.held, 0);
}

TEST(ExternalComm, ATaggedCollectiveWhosePeerNeverComesTimesOutInItsCheck) {
  TableLedger ledger;
  const auto results = OnExternalRanks(
      2, ledger,
      [](int r, Communicator& comm) -> Status {
        if (r == 1) return absl::OkStatus();
        std::vector<float> data(8, 1.0f);
        return comm.Broadcast(data.data(), 8, DType::kFP32, 0, kHostValuesTag)->Wait();
      },
      -1, 0, /*check_timeout_s=*/0.2);
  EXPECT_THAT(results[0], StatusIs(absl::StatusCode::kDeadlineExceeded,
                                   HasSubstr("the signature check of Broadcast(count=8, fp32, root=0, host values)")));
}

TEST(ExternalComm, CreationRefusesBadArgumentsWithoutCallingTheTable) {
  TableLedger ledger;
  auto group = CreateLocalGroup(1);
  ASSERT_THAT(group, IsOk());
  std::shared_ptr<Communicator> only = std::move((*group)[0]);
  EXPECT_THAT(CreateExternalCommunicator(2, 2, LocalTable(only, only, ledger)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2 of 2")));
  EXPECT_THAT(CreateExternalCommunicator(0, 2, LocalTable(only, only, ledger), {3, 60}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ranks_on_this_host 3")));
  EXPECT_THAT(CreateExternalCommunicator(0, 1, LocalTable(only, only, ledger), {1, -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("check_timeout_s")));
  ExternalCollectives missing = LocalTable(only, only, ledger);
  missing.test = nullptr;
  EXPECT_THAT(CreateExternalCommunicator(0, 1, missing),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("start, wait, test and release")));
  EXPECT_EQ(ledger.destroyed, 0);
}

}  // namespace
}  // namespace zero::comm
