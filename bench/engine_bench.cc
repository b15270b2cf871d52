// Engine overheads on the iteration path.
//
// BM_GradReady/<params>/<stage>: one micro-batch of `params` small params (BeginIteration,
// GradReady for each in backward order, EndBackward) on one in-process rank, with one bucket so
// the count is dominated by the per-call bookkeeping. Reports ns per GradReady (the timed
// region is the GradReady loop alone).
//
// BM_StepLrChange/<elems>/<groups>: the optimizer step (AdamW, stage 2, one in-process rank) of
// `elems` fp32 elements spread over `groups` optimizer groups, timed alternately as it is and
// right after SetGroupHyper changed every group's lr (as a scheduler does before each step).
// Reports both and their ratio: hyperparameters are kernel arguments, so the ratio is ~1.
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

// One micro-batch (zero gradients) and the step; returns the seconds Step() and, when
// `change_lr`, the SetGroupHyper calls before it took.
double TimedStep(Engine& engine, int params, bool change_lr, float lr) {
  (void)engine.BeginIteration();
  for (int p = params - 1; p >= 0; --p) (void)engine.GradReady(p);
  (void)engine.EndBackward();
  const auto start = std::chrono::steady_clock::now();
  if (change_lr) {
    for (int g = 0; g < engine.num_groups(); ++g) {
      OptimizerHyper hyper = *engine.GroupHyper(g);
      hyper.lr = lr;
      (void)engine.SetGroupHyper(g, hyper);
    }
  }
  (void)engine.Step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void BM_StepLrChange(benchmark::State& state) {
  const int64_t elems = state.range(0);
  const int groups = static_cast<int>(state.range(1));
  Config config;
  config.stage = 2;
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(config, *(*group)[0]);
  if (!engine.ok()) {
    state.SkipWithError(std::string(engine.status().message()).c_str());
    return;
  }
  for (int p = 0; p < groups; ++p) {
    (void)(*engine)->RegisterParam({"p" + std::to_string(p), {elems / groups}, DType::kFP32, true, p});
  }
  if (!(*engine)->Finalize().ok()) {
    state.SkipWithError("finalize failed");
    return;
  }
  double plain = 0, changed = 0;
  float lr = 1e-3f;
  for (auto _ : state) {
    plain += TimedStep(**engine, groups, false, lr);
    lr *= 0.999f;
    changed += TimedStep(**engine, groups, true, lr);
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["step_ms"] = 1e3 * plain / n;
  state.counters["step_with_lr_change_ms"] = 1e3 * changed / n;
  state.counters["ratio"] = changed / plain;
}

BENCHMARK(BM_StepLrChange)
    ->ArgsProduct({{1 << 22}, {1, 4}})
    ->ArgNames({"elems", "groups"})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zero::bench

BENCHMARK_MAIN();
