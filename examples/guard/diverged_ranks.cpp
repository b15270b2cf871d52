// Ranks whose buckets differ (here: one rank configured with other bucket sizes) would reduce
// unrelated data or hang. Finalize compares the config values that shape the collectives and
// names the key and both sides (guard.consistency_check also compares each bucket's
// iteration, index, size and layout before its collective, for ranks whose control flow
// diverges later).
#include "ranks.h"

int main() {
  return example::OnRanks(2, [](int rank, zero::comm::Communicator& comm) -> zero::Status {
    zero::Config config;
    config.guard.consistency_check = true;
    config.guard.timeout_s = 5;
    config.buckets.first_bucket_elems = rank == 1 ? 1000 : 16;
    config.buckets.reduce_bucket_elems = rank == 1 ? 1000 : 16;
    ZERO_ASSIGN_OR_RETURN(auto e, example::TwoLayerEngine(comm, config));
    const std::vector<float> embed(32, 0.5f), head(16, 0.1f);
    ZERO_RETURN_IF_ERROR(e->BeginIteration());
    ZERO_RETURN_IF_ERROR(e->AccumulateGrad(1, head.data()));
    ZERO_RETURN_IF_ERROR(e->AccumulateGrad(0, embed.data()));
    return e->EndBackward();
  }, [](const zero::Status& s) {
    return absl::IsInvalidArgument(s) && s.message().find("buckets.reduce_bucket_elems") != std::string::npos;
  });
}
