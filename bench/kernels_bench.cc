// CPU optimizer kernels against the memory-bandwidth roofline.
//
// BM_Triad_CPU/<n>/<threads>     the roofline (12 B/element counted)
// BM_AdamW_CPU/<n>/<threads>     fused AdamW, fp32 p/g/m/v (28 B/param: read 16, write 12)
// BM_AdamW_BF16_CPU/<n>/<threads> bf16 grads and params, fp32 master/m/v (28 B/param)
// threads = 0 means all cores. Every AdamW run also measures the triad at the same size and
// thread count in the same process and reports `frac_of_triad` = AdamW bytes/s ÷ triad bytes/s.
#include <benchmark/benchmark.h>

#include <omp.h>

#include <chrono>
#include <string>
#include <vector>

#include "bench/triad.h"
#include "kernels/cpu/optimizers.h"

namespace zero::bench {
namespace {

constexpr double kAdamBytesPerParam = 28.0;

void BM_Triad_CPU(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  for (auto _ : state) {
    Triad(a.data(), b.data(), c.data(), 3.0f, n, threads);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * 12);
}

void RunAdamW(benchmark::State& state, DType low_precision) {
  const int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const bool mixed = low_precision != DType::kFP32;
  std::vector<float> master(n, 0.5f), m(n, 0.01f), v(n, 1e-4f), grad32(mixed ? 0 : n, 0.1f);
  std::vector<uint16_t> param16(mixed ? n : 0, 0), grad16(mixed ? n : 0, 0x3dcc);
  kernels::Segment segment;
  segment.master = master.data();
  segment.model_param = mixed ? param16.data() : nullptr;
  segment.grad = mixed ? static_cast<const void*>(grad16.data()) : grad32.data();
  segment.state0 = m.data();
  segment.state1 = v.data();
  segment.numel = n;
  const kernels::SegmentTypes types = {low_precision, low_precision};
  kernels::CpuExec exec;
  exec.threads = threads;
  kernels::AdamHyper hyper;
  hyper.weight_decay = 0.01f;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    ++hyper.step;
    const Status status = kernels::AdamStepCpu(hyper, types, {segment}, exec);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      return;
    }
    benchmark::ClobberMemory();
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  const double adam_bytes = static_cast<double>(state.iterations()) * kAdamBytesPerParam * n;
  state.SetBytesProcessed(static_cast<int64_t>(adam_bytes));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * n);
  const double triad = MeasureTriadBandwidth(n, threads);
  state.counters["triad_GBps"] = triad / 1e9;
  state.counters["frac_of_triad"] = adam_bytes / elapsed.count() / triad;
  state.counters["isa"] = static_cast<double>(exec.isa);
  state.counters["threads"] = threads > 0 ? threads : omp_get_max_threads();
}

void BM_AdamW_CPU(benchmark::State& state) { RunAdamW(state, DType::kFP32); }
void BM_AdamW_BF16_CPU(benchmark::State& state) { RunAdamW(state, DType::kBF16); }

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{1} << 20, int64_t{1} << 24, int64_t{1} << 26}) {
    for (int threads : {1, 0}) b->Args({n, threads});
  }
  b->ArgNames({"n", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Triad_CPU)->Apply(Sizes);
BENCHMARK(BM_AdamW_CPU)->Apply(Sizes);
BENCHMARK(BM_AdamW_BF16_CPU)->Apply(Sizes);

}  // namespace
}  // namespace zero::bench

BENCHMARK_MAIN();
