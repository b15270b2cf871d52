// Engine overheads on the iteration path.
//
// BM_GradReady/<params>/<stage>: one micro-batch of `params` small params (BeginIteration,
// GradReady for each in backward order, EndBackward) on one in-process rank, with one bucket so
// the count is dominated by the per-call bookkeeping. Reports ns per GradReady (the timed
// region is the GradReady loop alone).
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero::bench {
namespace {

void BM_GradReady(benchmark::State& state) {
  const int params = static_cast<int>(state.range(0));
  Config config;
  config.stage = static_cast<int>(state.range(1));
  config.buckets.first_bucket_elems = config.buckets.reduce_bucket_elems = int64_t{64} * params;
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(config, *(*group)[0]);
  if (!engine.ok()) {
    state.SkipWithError(std::string(engine.status().message()).c_str());
    return;
  }
  for (int p = 0; p < params; ++p) (void)(*engine)->RegisterParam({"p" + std::to_string(p), {8}});
  if (!(*engine)->Finalize().ok()) {
    state.SkipWithError("finalize failed");
    return;
  }
  int64_t calls = 0;
  double ready_ns = 0;
  for (auto _ : state) {
    if (!(*engine)->BeginIteration().ok()) state.SkipWithError("BeginIteration failed");
    const auto start = std::chrono::steady_clock::now();
    for (int p = params - 1; p >= 0; --p) {
      if (!(*engine)->GradReady(p).ok()) state.SkipWithError("GradReady failed");
    }
    ready_ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    calls += params;
    if (!(*engine)->EndBackward().ok()) state.SkipWithError("EndBackward failed");
    if (!(*engine)->Step().ok()) state.SkipWithError("Step failed");
  }
  state.counters["ns_per_grad_ready"] = ready_ns / calls;
}

BENCHMARK(BM_GradReady)
    ->ArgsProduct({{1000, 100000}, {0, 1, 2}})
    ->ArgNames({"params", "stage"})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zero::bench

BENCHMARK_MAIN();
