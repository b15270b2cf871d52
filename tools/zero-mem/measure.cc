// Training a layer stack with synthetic gradients and reading the engine's memory stats.
#include "measure.h"

#include <algorithm>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero::tools {
namespace {

Status TrainRank(comm::Communicator& comm, const MeasureOptions& o, int stage, MemoryStats* stats) {
  Config config;
  config.stage = stage;
  config.optimizer.type = o.optimizer;
  if (o.optimizer == OptimizerType::kSgd) config.optimizer.momentum = 0.9f;  // its buffer, as the formula counts
  config.precision.param = o.dtype;
  config.precision.grad = config.precision.reduce = o.grad_dtype;
  if (o.dtype == DType::kFP16) config.loss_scale.mode = LossScaleMode::kDynamic;
  config.guard.timeout_s = 120;
  // Stage 3: one unit per layer, prefetching two layers ahead (the live window of the table).
  config.stage3.persistence_threshold = 0;
  config.stage3.prefetch_elems = 2 * int64_t{o.width} * o.width;
  ZERO_ASSIGN_OR_RETURN(auto engine, Engine::Create(config, comm));
  // Per layer: its trainable params (and, for LoRA, a frozen base in a unit of its own).
  const bool lora = o.lora_rank > 0;
  std::vector<std::vector<ParamId>> trainable(o.layers);
  for (int l = 0; l < o.layers; ++l) {
    const std::string name = "layer" + std::to_string(l);
    if (!lora) {
      ZERO_ASSIGN_OR_RETURN(ParamId id, engine->RegisterParam({name + ".weight", {o.width, o.width}, o.dtype, true, 0, l}));
      trainable[l].push_back(id);
      continue;
    }
    ZERO_RETURN_IF_ERROR(
        engine->RegisterParam({name + ".base", {o.width, o.width}, o.dtype, false, 0, 2 * l}).status());
    for (const char* adapter : {".lora_a", ".lora_b"}) {
      ZERO_ASSIGN_OR_RETURN(ParamId id,
                            engine->RegisterParam({name + adapter, {o.lora_rank, o.width}, o.dtype, true, 0, 2 * l + 1}));
      trainable[l].push_back(id);
    }
  }
  ZERO_RETURN_IF_ERROR(engine->Finalize());
  const int units_per_layer = lora ? 2 : 1;
  auto gather = [&](int l) -> Status {
    for (int u = 0; u < units_per_layer; ++u) ZERO_RETURN_IF_ERROR(engine->Gather(units_per_layer * l + u));
    return absl::OkStatus();
  };
  auto release = [&](int l) -> Status {
    for (int u = 0; u < units_per_layer; ++u) ZERO_RETURN_IF_ERROR(engine->Release(units_per_layer * l + u));
    return absl::OkStatus();
  };
  // Zeros: the bytes, not the values, matter here (the largest trainable param's).
  std::vector<char> grad(int64_t{o.width} * (lora ? o.lora_rank : o.width) * DTypeSize(o.dtype), 0);
  for (int step = 0; step < o.steps; ++step) {
    ZERO_RETURN_IF_ERROR(engine->BeginIteration());
    for (int l = 0; l < o.layers; ++l) {  // forward: each layer gathered while it computes
      ZERO_RETURN_IF_ERROR(gather(l));
      ZERO_RETURN_IF_ERROR(release(l));
    }
    for (int l = o.layers - 1; l >= 0; --l) {  // backward: gathered again for its gradient
      ZERO_RETURN_IF_ERROR(gather(l));
      for (ParamId id : trainable[l]) ZERO_RETURN_IF_ERROR(engine->AccumulateGrad(id, grad.data()));
      ZERO_RETURN_IF_ERROR(release(l));
    }
    ZERO_RETURN_IF_ERROR(engine->EndBackward());
    ZERO_RETURN_IF_ERROR(engine->Step().status());
  }
  *stats = engine->GetMemoryStats();
  return absl::OkStatus();
}

}  // namespace

std::pair<double, double> ModelParams(const MeasureOptions& o) {
  const double square = double(o.layers) * o.width * o.width;
  if (o.lora_rank == 0) return {square, 0};
  return {2.0 * o.layers * o.width * o.lora_rank, square};
}

StatusOr<MemoryStats> MeasureLocal(const MeasureOptions& options, int stage, int ranks) {
  ZERO_ASSIGN_OR_RETURN(auto group, comm::CreateLocalGroup(ranks));
  std::vector<MemoryStats> stats(ranks);
  std::vector<Status> results(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] { results[r] = TrainRank(*group[r], options, stage, &stats[r]); });
  }
  for (auto& t : threads) t.join();
  // The cause, not its echo: a rank that failed by itself (out of memory) leaves its peers
  // waiting for it until they time out or learn the group broke.
  auto cause = std::find_if(results.begin(), results.end(), [](const Status& s) {
    return !s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded && s.code() != absl::StatusCode::kCancelled &&
           s.code() != absl::StatusCode::kUnavailable;
  });
  if (cause == results.end()) cause = std::find_if(results.begin(), results.end(), [](const Status& s) { return !s.ok(); });
  if (cause == results.end()) return stats[0];
  return Status(cause->code(), absl::StrCat("rank ", cause - results.begin(), ": ", cause->message()));
}

}  // namespace zero::tools
