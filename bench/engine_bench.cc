// Engine overheads on the iteration path.
//
// BM_GradReady/<params>/<stage>: one micro-batch of `params` small params (BeginIteration,
// GradReady for each in backward order, EndBackward) on one in-process rank, with one bucket so
// the count is dominated by the per-call bookkeeping. Reports ns per GradReady (the timed
// region is the GradReady loop alone).
//
// BM_RegisterParams/<params>: RegisterParam of `params` one-element params into a new engine
// (one in-process rank), then Finalize. Reports ns per RegisterParam and Finalize's ms: both grow
// linearly with the count (a registration scanned every earlier name: quadratic).
//
// BM_StepLrChange/<elems>/<groups>: the optimizer step (AdamW, stage 2, one in-process rank) of
// `elems` fp32 elements spread over `groups` optimizer groups, timed alternately as it is and
// right after SetGroupHyper changed every group's lr (as a scheduler does before each step).
// Reports both and their ratio: hyperparameters are kernel arguments, so the ratio is ~1.
//
// BM_GradHandOver/<params>: AccumulateGrad of `params` fp32 params of 1M elements each (64 MB
// at 16: out of every cache) on one in-process rank at stage 1, two micro-batches per step:
// the first micro-batch's hand-over copies each gradient into its slot, the second adds into
// it. Reports ns per element of each, and of memcpy of the same bytes between the same kinds
// of buffers measured in the same run (the roofline): a copy at ~1× memcpy, an add (reading
// the slot too) slower. Before the first hand-over copied, it was a zeroing pass plus an add:
// memset of the same bytes is measured too, so that cost is memset + the later hand-over.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

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

void BM_RegisterParams(benchmark::State& state) {
  const int params = static_cast<int>(state.range(0));
  auto group = comm::CreateLocalGroup(1);
  std::vector<std::string> names;
  for (int p = 0; p < params; ++p) names.push_back("layers." + std::to_string(p) + ".weight");
  double register_ns = 0, finalize_ms = 0;
  for (auto _ : state) {
    auto engine = Engine::Create(Config{}, *(*group)[0]);
    if (!engine.ok()) {
      state.SkipWithError(std::string(engine.status().message()).c_str());
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& name : names) {
      if (!(*engine)->RegisterParam({name, {1}}).ok()) state.SkipWithError("RegisterParam failed");
    }
    const auto registered = std::chrono::steady_clock::now();
    if (!(*engine)->Finalize().ok()) state.SkipWithError("Finalize failed");
    register_ns += std::chrono::duration<double, std::nano>(registered - start).count();
    finalize_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - registered).count();
  }
  state.counters["ns_per_register"] = register_ns / (static_cast<double>(state.iterations()) * params);
  state.counters["finalize_ms"] = finalize_ms / static_cast<double>(state.iterations());
}

BENCHMARK(BM_RegisterParams)->Arg(10000)->Arg(200000)->ArgName("params")->Unit(benchmark::kMillisecond);

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

void BM_GradHandOver(benchmark::State& state) {
  const int params = static_cast<int>(state.range(0));
  constexpr int64_t kElems = int64_t{1} << 20;
  Config config;
  config.stage = 1;
  config.gradient_accumulation_steps = 2;
  config.optimizer.type = OptimizerType::kSgd;
  auto group = comm::CreateLocalGroup(1);
  auto engine = Engine::Create(config, *(*group)[0]);
  if (!engine.ok()) {
    state.SkipWithError(std::string(engine.status().message()).c_str());
    return;
  }
  for (int p = 0; p < params; ++p) (void)(*engine)->RegisterParam({"p" + std::to_string(p), {kElems}});
  if (!(*engine)->Finalize().ok()) {
    state.SkipWithError("finalize failed");
    return;
  }
  std::vector<std::vector<float>> grads(params, std::vector<float>(kElems, 1e-3f));
  std::vector<std::vector<float>> copies(params, std::vector<float>(kElems));
  auto micro_batch = [&]() -> double {  // seconds of the hand-over loop
    if (!(*engine)->BeginIteration().ok()) state.SkipWithError("BeginIteration failed");
    const auto start = std::chrono::steady_clock::now();
    for (int p = params - 1; p >= 0; --p) {
      if (!(*engine)->AccumulateGrad(p, grads[p].data()).ok()) state.SkipWithError("AccumulateGrad failed");
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!(*engine)->EndBackward().ok()) state.SkipWithError("EndBackward failed");
    return seconds;
  };
  double copy = 0, add = 0, memcpy_seconds = 0, memset_seconds = 0;
  for (auto _ : state) {
    copy += micro_batch();
    add += micro_batch();
    if (!(*engine)->Step().ok()) state.SkipWithError("Step failed");
    const auto start = std::chrono::steady_clock::now();
    for (int p = params - 1; p >= 0; --p) std::memcpy(copies[p].data(), grads[p].data(), kElems * sizeof(float));
    const auto copied = std::chrono::steady_clock::now();
    memcpy_seconds += std::chrono::duration<double>(copied - start).count();
    for (int p = params - 1; p >= 0; --p) std::memset(copies[p].data(), 0, kElems * sizeof(float));
    memset_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - copied).count();
    benchmark::DoNotOptimize(copies[0].data());
  }
  const double elems = static_cast<double>(state.iterations()) * params * kElems;
  state.counters["first_ns_per_elem"] = 1e9 * copy / elems;
  state.counters["later_ns_per_elem"] = 1e9 * add / elems;
  state.counters["memcpy_ns_per_elem"] = 1e9 * memcpy_seconds / elems;
  state.counters["memset_ns_per_elem"] = 1e9 * memset_seconds / elems;
  state.counters["first_vs_memcpy"] = copy / memcpy_seconds;
  state.counters["later_vs_memcpy"] = add / memcpy_seconds;
}

BENCHMARK(BM_GradHandOver)->Arg(16)->ArgName("params")->Unit(benchmark::kMillisecond);

BENCHMARK(BM_StepLrChange)
    ->ArgsProduct({{1 << 22}, {1, 4}})
    ->ArgNames({"elems", "groups"})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zero::bench

BENCHMARK_MAIN();
