// A table of collectives for the external communicator that runs each channel on an
// in-process group (one thread per rank), and a runner of every rank over such tables: the
// external communicator tested without any transport of its own, on host or device buffers.
#ifndef ZERO_TESTS_COMM_LOCAL_TABLE_H_
#define ZERO_TESTS_COMM_LOCAL_TABLE_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "zero/communicator.h"

namespace zero::testing {

// What the tables of one test share: handles still held and destroy calls, summed over ranks.
struct TableLedger {
  std::atomic<int> held{0};
  std::atomic<int> destroyed{0};
};

// One rank's table: channel c runs on its communicator of in-process group c. `fail_start_at`
// > 0 makes that start (counted from 1) fail.
inline comm::ExternalCollectives LocalTable(std::shared_ptr<comm::Communicator> channel0,
                                           std::shared_ptr<comm::Communicator> channel1, TableLedger& ledger,
                                           int fail_start_at = 0) {
  using comm::CollectiveKind;
  using comm::Communicator;
  using comm::WorkPtr;
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
  comm::ExternalCollectives table;
  table.start = [state, &ledger, fail_start_at](const comm::ExternalCollective& c) -> StatusOr<int64_t> {
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
    comm::Work* work;
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
// runs on two fresh in-process groups; returns each rank's status. Rank `failing_rank`'s
// table fails its start number `fail_start_at`.
template <typename Body>
std::vector<Status> OnExternalRanks(int world, TableLedger& ledger, Body body, int failing_rank = -1,
                                    int fail_start_at = 0, double check_timeout_s = 60) {
  std::vector<Status> statuses(world);
  auto channel0 = comm::CreateLocalGroup(world);
  auto channel1 = comm::CreateLocalGroup(world);
  if (!channel0.ok() || !channel1.ok()) {
    statuses.assign(world, channel0.ok() ? channel1.status() : channel0.status());
    return statuses;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    std::shared_ptr<comm::Communicator> c0 = std::move((*channel0)[r]), c1 = std::move((*channel1)[r]);
    threads.emplace_back([&, r, c0, c1] {
      auto external = comm::CreateExternalCommunicator(
          r, world, LocalTable(c0, c1, ledger, r == failing_rank ? fail_start_at : 0),
          {/*ranks_on_this_host=*/world, check_timeout_s});
      statuses[r] = external.ok() ? body(r, **external) : external.status();
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

}  // namespace zero::testing

#endif  // ZERO_TESTS_COMM_LOCAL_TABLE_H_
