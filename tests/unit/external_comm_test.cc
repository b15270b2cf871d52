// The external communicator (collectives run by a table of functions): the conformance suite
// and toy training through a table over two in-process groups (one per channel), equal bit
// for bit to the in-process communicator's; tagged collectives that diverge named on every
// rank; a table that fails, a peer that never comes, abandoned works; the table's handles
// all released and its destroy called once.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/comm/conformance.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero::comm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

// What the tables of one test share: handles still held and destroy calls, summed over ranks.
struct TableLedger {
  std::atomic<int> held{0};
  std::atomic<int> destroyed{0};
};

// One rank's table: channel c runs on its communicator of in-process group c. `fail_start_at`
// > 0 makes that start (counted from 1) fail.
ExternalCollectives LocalTable(std::shared_ptr<Communicator> channel0, std::shared_ptr<Communicator> channel1,
                               TableLedger& ledger, int fail_start_at = 0) {
  struct State {
    std::shared_ptr<Communicator> channels[2];
    std::mutex mutex;
    std::map<int64_t, WorkPtr> works;
    int64_t next = 100;
    int starts = 0;
  };
  auto state = std::make_shared<State>();
  state->channels[0] = std::move(channel0);
  state->channels[1] = std::move(channel1);
  ExternalCollectives table;
  table.start = [state, &ledger, fail_start_at](const ExternalCollective& c) -> StatusOr<int64_t> {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (++state->starts == fail_start_at) return absl::UnavailableError("the table's transport is down");
    Communicator& comm = *state->channels[c.channel];
    WorkPtr work;
    switch (c.kind) {
      case CollectiveKind::kReduceScatter: work = comm.ReduceScatter(c.send, c.recv, c.count, c.dtype, c.op); break;
      case CollectiveKind::kAllGather: work = comm.AllGather(c.send, c.recv, c.count, c.dtype); break;
      case CollectiveKind::kAllReduce: work = comm.AllReduce(c.send, c.recv, c.count, c.dtype, c.op); break;
      case CollectiveKind::kBroadcast: work = comm.Broadcast(c.recv, c.count, c.dtype, c.root); break;
      case CollectiveKind::kBarrier: work = comm.Barrier(); break;
    }
    ++ledger.held;
    state->works[state->next] = std::move(work);
    return state->next++;
  };
  table.wait = [state](int64_t handle, double timeout_s) {
    Work* work;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      work = state->works.at(handle).get();
    }
    return work->Wait(timeout_s);
  };
  table.test = [state](int64_t handle) {
    std::lock_guard<std::mutex> lock(state->mutex);
    return state->works.at(handle)->Test();
  };
  table.release = [state, &ledger](int64_t handle) {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->works.erase(handle) == 1) --ledger.held;
  };
  table.destroy = [&ledger] { ++ledger.destroyed; };
  return table;
}

// Runs body(rank, comm) on `world` threads, each over an external communicator whose table
// runs on two fresh in-process groups; returns each rank's status.
template <typename Body>
std::vector<Status> OnExternalRanks(int world, TableLedger& ledger, Body body, int failing_rank = -1,
                                    int fail_start_at = 0, double check_timeout_s = 60) {
  std::vector<Status> statuses(world);
  auto channel0 = CreateLocalGroup(world);
  auto channel1 = CreateLocalGroup(world);
  EXPECT_THAT(channel0, IsOk());
  EXPECT_THAT(channel1, IsOk());
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    std::shared_ptr<Communicator> c0 = std::move((*channel0)[r]), c1 = std::move((*channel1)[r]);
    threads.emplace_back([&, r, c0, c1] {
      auto comm = CreateExternalCommunicator(
          r, world, LocalTable(c0, c1, ledger, r == failing_rank ? fail_start_at : 0),
          {/*ranks_on_this_host=*/world, check_timeout_s});
      statuses[r] = comm.ok() ? body(r, **comm) : comm.status();
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

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
    return comm.Health().code() == absl::StatusCode::kCancelled
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
