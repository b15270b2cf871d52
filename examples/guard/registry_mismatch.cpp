// Ranks that register their params differently (a conditional layer, a different model
// config) would issue mismatched collectives and hang until a watchdog fires. ZeroRT compares
// the registries at Finalize and every rank names the first param that differs.
#include "ranks.h"

int main() {
  return example::OnRanks(2, [](int rank, zero::comm::Communicator& comm) -> zero::Status {
    return example::TwoLayerEngine(comm, zero::Config{}, /*swapped=*/rank == 1).status();
  }, [](const zero::Status& s) { return absl::IsInvalidArgument(s); });
}
