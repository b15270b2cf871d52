// Memory at stages 1 and 2 against DESIGN.md's per-rank table (the ZeRO paper's), measured by
// the accounting allocator on in-process ranks.
#include <gtest/gtest.h>

#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::Each;
using testing::IsOk;
using testing::RunOnRanks;
using testing::ToyConfig;

// DESIGN.md's per-rank table with 2-byte params/grads and K = 12 (bf16 + fp32 master/m/v):
// stage 1: (2 + 2)Ψ + 12Ψ/N; stage 2: 2Ψ + (2 + 12)Ψ/N plus the declared bucket buffers.
TEST(EngineMemory, MatchesTheZeroPaperTableWithinTwoPercent) {
  constexpr int kWorld = 4;
  const std::vector<int64_t> layer = {1024, 1024};  // 8 layers ≈ 8.4M params
  for (int stage : {1, 2}) {
    Config config = ToyConfig(stage);
    config.precision.param = config.precision.grad = config.precision.reduce = DType::kBF16;
    config.buckets.first_bucket_elems = config.buckets.reduce_bucket_elems = 2'200'000;
    config.buckets.pool_buffers = 2;
    std::vector<MemoryStats> stats(kWorld);
    ASSERT_THAT(RunOnRanks(kWorld, [&](int r, comm::Communicator& comm) -> Status {
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
      for (int l = 0; l < 8; ++l) {
        ZERO_RETURN_IF_ERROR(engine->RegisterParam({"layer" + std::to_string(l), layer, DType::kBF16}).status());
      }
      ZERO_RETURN_IF_ERROR(engine->Finalize());
      stats[r] = engine->GetMemoryStats();
      return absl::OkStatus();
    }), Each(IsOk()));
    const double psi = 8.0 * 1024 * 1024, n = kWorld;
    const MemoryStats& m = stats[0];
    const double params = m.Current(MemoryCategory::kParams), grads = m.Current(MemoryCategory::kGrads),
                 optimizer = m.Current(MemoryCategory::kOptimizer);
    EXPECT_NEAR(params, 2 * psi, 0.02 * 2 * psi) << "stage " << stage;
    EXPECT_NEAR(optimizer, 12 * psi / n, 0.02 * 12 * psi / n) << "stage " << stage;
    const double want_grads = stage == 1 ? 2 * psi : 2 * psi / n;
    EXPECT_NEAR(grads, want_grads, 0.02 * want_grads) << "stage " << stage;
    const double model_states = params + grads + optimizer;
    const double table = stage == 1 ? 4 * psi + 12 * psi / n : 2 * psi + 14 * psi / n;
    EXPECT_NEAR(model_states, table, 0.02 * table) << "stage " << stage;
    const double pool = m.Current(MemoryCategory::kCommBuffers);
    if (stage == 2) {
      EXPECT_NEAR(pool, 2.0 * 2 * 2'097'152, 0.02 * pool) << "two buffers of the largest bucket";
    } else {
      EXPECT_EQ(pool, 0);
    }
  }
}

}  // namespace
}  // namespace zero
