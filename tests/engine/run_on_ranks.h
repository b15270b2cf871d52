// Runs a function on every rank of an in-process group, one thread per rank (gloo's
// threads-as-ranks tests), and returns each rank's status.
#ifndef ZERO_TESTS_ENGINE_RUN_ON_RANKS_H_
#define ZERO_TESTS_ENGINE_RUN_ON_RANKS_H_

#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "zero/communicator.h"
#include "zero/status.h"

namespace zero::testing {

/// Calls fn(rank, communicator) on `world` threads over a fresh local group. `fn` returns a
/// Status (collected per rank) or nothing (gtest assertions inside it report for themselves).
template <typename Fn>
std::vector<Status> RunOnRanks(int world, Fn fn) {
  std::vector<Status> statuses(world);
  StatusOr<std::vector<std::unique_ptr<comm::Communicator>>> group = comm::CreateLocalGroup(world);
  if (!group.ok()) {
    statuses.assign(world, group.status());
    return statuses;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      if constexpr (std::is_void_v<decltype(fn(r, *(*group)[r]))>) {
        fn(r, *(*group)[r]);
      } else {
        statuses[r] = fn(r, *(*group)[r]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

}  // namespace zero::testing

#endif  // ZERO_TESTS_ENGINE_RUN_ON_RANKS_H_
