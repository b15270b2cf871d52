// CUDA optimizer kernels against the device-memory roofline measured in the same run.
//
// BM_Copy_CUDA/<n>        cudaMemcpy device-to-device of 4n bytes: read + write counted (8 B/elem)
// BM_AdamW_CUDA/<n>       fused AdamW, fp32 p/g/m/v: 28 B/param counted (read 16, write 12)
// BM_AdamW_BF16_CUDA/<n>  bf16 params and grads, fp32 master/m/v: 28 B/param counted
// Each AdamW run also times the copy of the same bytes and reports `frac_of_copy` = AdamW
// bytes/s ÷ copy bytes/s. Times come from CUDA events around 20 launches after a warm-up.
// Skips (with a message) where no CUDA device is present.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/optimizers_cuda.h"

namespace zero::bench {
namespace {

constexpr int kRepeats = 20;

bool HaveDevice(benchmark::State& state) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    state.SkipWithError("no CUDA device");
    return false;
  }
  return true;
}

// Seconds per call of fn(), from CUDA events over kRepeats calls after one warm-up.
template <typename Fn>
double TimeCuda(Fn fn) {
  fn();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int i = 0; i < kRepeats; ++i) fn();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3 / kRepeats;
}

double CopyBandwidth(int64_t bytes) {
  void *a = nullptr, *b = nullptr;
  cudaMalloc(&a, bytes);
  cudaMalloc(&b, bytes);
  const double seconds = TimeCuda([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / seconds;
}

void BM_Copy_CUDA(benchmark::State& state) {
  if (!HaveDevice(state)) return;
  const int64_t bytes = state.range(0) * 4;
  double bandwidth = 0;
  for (auto _ : state) {
    bandwidth = CopyBandwidth(bytes);
    state.SetIterationTime(2.0 * bytes / bandwidth);
  }
  state.counters["GBps"] = bandwidth / 1e9;
}

void RunAdamW(benchmark::State& state, DType low) {
  if (!HaveDevice(state)) return;
  const int64_t n = state.range(0);
  const bool mixed = low != DType::kFP32;
  float *master, *m, *v;
  void *grad, *param = nullptr;
  cudaMalloc(&master, n * 4);
  cudaMalloc(&m, n * 4);
  cudaMalloc(&v, n * 4);
  cudaMalloc(&grad, n * (mixed ? 2 : 4));
  if (mixed) cudaMalloc(&param, n * 2);
  cudaMemset(master, 0, n * 4);
  cudaMemset(m, 0, n * 4);
  cudaMemset(v, 0, n * 4);
  cudaMemset(grad, 0, n * (mixed ? 2 : 4));
  kernels::Segment segment{master, param, grad, m, v, n};
  kernels::AdamHyper hyper;
  hyper.weight_decay = 0.01f;
  Status status = absl::OkStatus();
  double seconds = 0;
  for (auto _ : state) {
    seconds = TimeCuda([&] { status.Update(kernels::AdamStepCuda(hyper, {low, low}, {segment}, nullptr)); });
    state.SetIterationTime(seconds);
  }
  if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
  const double bytes = 28.0 * n;
  state.counters["GBps"] = bytes / seconds / 1e9;
  state.counters["frac_of_copy"] = bytes / seconds / CopyBandwidth(static_cast<int64_t>(bytes / 2));
  state.counters["Gparams_per_s"] = n / seconds / 1e9;
  cudaFree(master);
  cudaFree(m);
  cudaFree(v);
  cudaFree(grad);
  cudaFree(param);
}

void BM_AdamW_CUDA(benchmark::State& state) { RunAdamW(state, DType::kFP32); }
void BM_AdamW_BF16_CUDA(benchmark::State& state) { RunAdamW(state, DType::kBF16); }

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{1} << 20, int64_t{1} << 24, int64_t{1} << 27, int64_t{1} << 30}) b->Arg(n);
  b->ArgName("n")->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Copy_CUDA)->Apply(Sizes);
BENCHMARK(BM_AdamW_CUDA)->Apply(Sizes);
BENCHMARK(BM_AdamW_BF16_CUDA)->Apply(Sizes);

}  // namespace
}  // namespace zero::bench

BENCHMARK_MAIN();
