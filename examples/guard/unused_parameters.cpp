// A branch of the model runs on one rank only. DDP: "Expected to have finished reduction in
// the prior iteration before starting a new one", with parameter indices; DeepSpeed hangs.
// ZeroRT tells the rank which params got no gradient and how to fix it, and its peers get a
// DeadlineExceeded naming the bucket instead of hanging; guard.on_unused = "zero" handles it.
#include "ranks.h"

int main() {
  const std::vector<float> embed(32, 0.5f), head(16, 0.1f);
  auto step = [&](int rank, zero::Engine& e) -> zero::Status {
    ZERO_RETURN_IF_ERROR(e.BeginIteration());
    if (rank == 0) ZERO_RETURN_IF_ERROR(e.AccumulateGrad(1, head.data()));  // rank 1 skips the head
    ZERO_RETURN_IF_ERROR(e.AccumulateGrad(0, embed.data()));
    ZERO_RETURN_IF_ERROR(e.EndBackward());
    return e.Step().status();
  };
  zero::Config strict;
  strict.guard.timeout_s = 2;
  std::printf("== default guard.on_unused = \"error\"\n");
  const int refused = example::OnRanks(2, [&](int rank, zero::comm::Communicator& comm) -> zero::Status {
    ZERO_ASSIGN_OR_RETURN(auto e, example::TwoLayerEngine(comm, strict));
    return step(rank, *e);
  }, [](const zero::Status& s) { return zero::IsUnusedParameters(s) || absl::IsDeadlineExceeded(s); });
  std::printf("== guard.on_unused = \"zero\"\n");
  zero::Config zeros = strict;
  zeros.guard.on_unused = zero::UnusedPolicy::kZero;
  const int handled = example::OnRanks(2, [&](int rank, zero::comm::Communicator& comm) -> zero::Status {
    ZERO_ASSIGN_OR_RETURN(auto e, example::TwoLayerEngine(comm, zeros));
    return step(rank, *e);
  }, [](const zero::Status& s) { return s.ok(); });
  return refused + handled;
}
