// The next iteration starts while reductions of the last one are pending (a backward that
// returned early, an exception swallowed by the training loop). DDP reports it at the next
// forward; ZeroRT at BeginIteration, naming the buckets and the params they still wait for.
#include "ranks.h"

int main() {
  return example::OnRanks(1, [](int, zero::comm::Communicator& comm) -> zero::Status {
    ZERO_ASSIGN_OR_RETURN(auto e, example::TwoLayerEngine(comm, zero::Config{}));
    ZERO_RETURN_IF_ERROR(e->BeginIteration());
    const std::vector<float> head(16, 0.1f);
    ZERO_RETURN_IF_ERROR(e->AccumulateGrad(1, head.data()));
    return e->BeginIteration();  // forgot EndBackward(); embed.weight never arrived
  }, [](const zero::Status& s) { return absl::IsFailedPrecondition(s); });
}
