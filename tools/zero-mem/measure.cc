// Training a layer stack with synthetic gradients and reading the engine's memory stats.
#include "measure.h"

#include <string>
#include <thread>

#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero::tools {
namespace {

Status TrainRank(comm::Communicator& comm, const MeasureOptions& o, int stage, MemoryStats* stats) {
  Config config;
  config.stage = stage;
  config.optimizer.type = o.optimizer;
  config.precision.param = o.dtype;
  config.precision.grad = config.precision.reduce = o.grad_dtype;
  if (o.dtype == DType::kFP16) config.loss_scale.mode = LossScaleMode::kDynamic;
  config.guard.timeout_s = 120;
  // Stage 3: one unit per layer, prefetching two layers ahead (the live window of the table).
  config.stage3.persistence_threshold = 0;
  config.stage3.prefetch_elems = 2 * int64_t{o.width} * o.width;
  ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, comm));
  const int64_t numel = int64_t{o.width} * o.width;
  for (int l = 0; l < o.layers; ++l) {
    ZERO_RETURN_IF_ERROR(
        engine->RegisterParam({"layer" + std::to_string(l) + ".weight", {o.width, o.width}, o.dtype, true, 0, l}).status());
  }
  ZERO_RETURN_IF_ERROR(engine->Finalize());
  std::vector<char> grad(numel * DTypeSize(o.dtype), 0);  // zeros: the bytes, not the values, matter here
  for (int step = 0; step < o.steps; ++step) {
    ZERO_RETURN_IF_ERROR(engine->BeginIteration());
    for (int l = 0; l < o.layers; ++l) {  // forward: each layer gathered while it computes
      ZERO_RETURN_IF_ERROR(engine->Gather(l));
      ZERO_RETURN_IF_ERROR(engine->Release(l));
    }
    for (int l = o.layers - 1; l >= 0; --l) {  // backward: gathered again for its gradient
      ZERO_RETURN_IF_ERROR(engine->Gather(l));
      ZERO_RETURN_IF_ERROR(engine->AccumulateGrad(l, grad.data()));
      ZERO_RETURN_IF_ERROR(engine->Release(l));
    }
    ZERO_RETURN_IF_ERROR(engine->EndBackward());
    ZERO_RETURN_IF_ERROR(engine->Step().status());
  }
  *stats = engine->GetMemoryStats();
  return absl::OkStatus();
}

}  // namespace

StatusOr<MemoryStats> MeasureLocal(const MeasureOptions& options, int stage, int ranks) {
  ZERO_ASSIGN_OR_RETURN(auto group, comm::CreateLocalGroup(ranks));
  std::vector<MemoryStats> stats(ranks);
  std::vector<Status> results(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] { results[r] = TrainRank(*group[r], options, stage, &stats[r]); });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : results) ZERO_RETURN_IF_ERROR(s);
  return stats[0];
}

}  // namespace zero::tools
