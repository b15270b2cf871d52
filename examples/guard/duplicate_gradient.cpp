// A weight used twice (tied embeddings; or reentrant activation checkpointing re-running
// backward) fires its gradient hook twice. DeepSpeed: "The parameter 657 has already been
// reduced. Gradient computed twice for this partition." DDP: "Expected to mark a variable
// ready only once." ZeroRT names the param, both arrivals and the fixes — and with
// guard.on_duplicate = "count" it handles the pattern correctly.
#include "ranks.h"

int main() {
  const std::vector<float> part(32, 0.5f), head(16, 0.1f);
  auto twice = [&](zero::Engine& e) -> zero::Status {
    ZERO_RETURN_IF_ERROR(e.BeginIteration());
    ZERO_RETURN_IF_ERROR(e.AccumulateGrad(1, head.data()));
    ZERO_RETURN_IF_ERROR(e.AccumulateGrad(0, part.data()));  // the output projection's use
    ZERO_RETURN_IF_ERROR(e.AccumulateGrad(0, part.data()));  // the input lookup's use
    ZERO_RETURN_IF_ERROR(e.EndBackward());
    return e.Step().status();
  };
  std::printf("== default guard.on_duplicate = \"error\"\n");
  const int refused = example::OnRanks(2, [&](int, zero::comm::Communicator& comm) -> zero::Status {
    ZERO_ASSIGN_OR_RETURN(auto e, example::TwoLayerEngine(comm, zero::Config{}));
    return twice(*e);
  }, [](const zero::Status& s) { return zero::IsDuplicateGradient(s); });
  std::printf("== guard.on_duplicate = \"count\"\n");
  zero::Config counting;
  counting.guard.on_duplicate = zero::DuplicatePolicy::kCount;
  const int handled = example::OnRanks(2, [&](int, zero::comm::Communicator& comm) -> zero::Status {
    ZERO_ASSIGN_OR_RETURN(auto e, example::TwoLayerEngine(comm, counting));
    return twice(*e);
  }, [](const zero::Status& s) { return s.ok(); });
  return refused + handled;
}
