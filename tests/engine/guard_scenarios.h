// The gradient guard's scenarios, each reproducing the real pattern behind a failure users hit
// (REFERENCE.md), written per rank so the same code runs on in-process ranks and under
// mpirun. Every rank of a fresh communicator calls the same scenario; it returns OK when the
// engine behaved as the guard promises (the exact status code, the param named in the message,
// and the trained values right where a policy handles the case), else an error saying what
// differed.
#ifndef ZERO_TESTS_ENGINE_GUARD_SCENARIOS_H_
#define ZERO_TESTS_ENGINE_GUARD_SCENARIOS_H_

#include <functional>
#include <string>
#include <vector>

#include "zero/communicator.h"

namespace zero::testing {

struct GuardScenario {
  std::string name;
  /// Runs the scenario on this rank with the engine at `stage` (2 or 3).
  std::function<Status(comm::Communicator&, int stage)> run;
};

/// Reentrant checkpointing (a hook firing twice), tied embeddings, a branch unused on one rank,
/// a param no rank used, a rank that skips EndBackward, ranks registering in different orders,
/// and ranks configured with different bucket sizes (refused by Finalize at stages 0-2).
std::vector<GuardScenario> GuardScenarios();

}  // namespace zero::testing

#endif  // ZERO_TESTS_ENGINE_GUARD_SCENARIOS_H_
