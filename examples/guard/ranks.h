// Shared by the guard examples: run one function per rank on in-process ranks and print what
// each rank was told. Each example shows one failure users of other libraries hit, and the
// message ZeroRT gives instead.
#ifndef ZERO_EXAMPLES_GUARD_RANKS_H_
#define ZERO_EXAMPLES_GUARD_RANKS_H_

#include <zero/communicator.h>
#include <zero/engine.h>

#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

namespace example {

/// Runs body(rank, comm) on `world` in-process ranks; prints each rank's final status; returns
/// 0 when every rank's status satisfies `expected`.
inline int OnRanks(int world, const std::function<zero::Status(int, zero::comm::Communicator&)>& body,
                   const std::function<bool(const zero::Status&)>& expected) {
  auto group = zero::comm::CreateLocalGroup(world);
  if (!group.ok()) return 2;
  std::vector<zero::Status> results(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back([&, r] { results[r] = body(r, *(*group)[r]); });
  for (auto& t : ranks) t.join();
  int failures = 0;
  for (int r = 0; r < world; ++r) {
    std::printf("rank %d: %s\n\n", r, results[r].ToString().c_str());
    if (!expected(results[r])) ++failures;
  }
  return failures == 0 ? 0 : 1;
}

/// A two-layer model: "embed.weight" [8, 4] and "head.weight" [4, 4], registered in `order`.
inline zero::StatusOr<std::unique_ptr<zero::Engine>> TwoLayerEngine(zero::comm::Communicator& comm,
                                                                    zero::Config config,
                                                                    bool swapped = false) {
  ZERO_ASSIGN_OR_RETURN(auto engine, zero::Engine::Create(config, comm));
  const zero::ParamSpec embed{"embed.weight", {8, 4}}, head{"head.weight", {4, 4}};
  ZERO_RETURN_IF_ERROR(engine->RegisterParam(swapped ? head : embed).status());
  ZERO_RETURN_IF_ERROR(engine->RegisterParam(swapped ? embed : head).status());
  ZERO_RETURN_IF_ERROR(engine->Finalize());
  return engine;
}

}  // namespace example

#endif  // ZERO_EXAMPLES_GUARD_RANKS_H_
