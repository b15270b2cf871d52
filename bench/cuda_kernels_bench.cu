// CUDA optimizer kernels against the device-memory roofline measured in the same run.
//
// BM_Copy_CUDA/<n>        cudaMemcpy device-to-device of 4n bytes: read + write counted (8 B/elem)
// BM_AdamW_CUDA/<n>       fused AdamW, fp32 p/g/m/v: 28 B/param counted (read 16, write 12)
// BM_AdamW_BF16_CUDA/<n>  bf16 params and grads, fp32 master/m/v: 28 B/param counted
//
// Method: inputs are fresh random values (never zeros); when one set of buffers would fit in
// L2, several sets are allocated and the launches rotate over them, so the figures are
// device-memory figures. A trial is kLaunchesPerTrial launches between two CUDA events after a
// warm-up; the reported time is the median of kTrials trials. Each AdamW run also times the
// copy of the same bytes (same rotation) and reports `frac_of_copy` = AdamW bytes/s ÷ copy
// bytes/s. Every CUDA call is checked. Skips (with a message) where no CUDA device is present.
#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/optimizers_cuda.h"

namespace zero::bench {
namespace {

constexpr int kTrials = 7;
constexpr int kLaunchesPerTrial = 20;
constexpr int kMaxSets = 16;

/// Records the first CUDA error of a benchmark run; later calls are skipped.
struct CudaChecker {
  cudaError_t first = cudaSuccess;
  const char* where = "";
  bool operator()(cudaError_t error, const char* call) {
    if (error != cudaSuccess && first == cudaSuccess) {
      first = error;
      where = call;
    }
    return first == cudaSuccess;
  }
  std::string message() const { return std::string(where) + ": " + cudaGetErrorString(first); }
};
#define BENCH_CUDA(checker, call) checker((call), #call)

bool HaveDevice(benchmark::State& state) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    state.SkipWithError("no CUDA device");
    return false;
  }
  return true;
}

/// How many buffer sets of `bytes_per_set` make the working set at least 4× the L2 cache.
int SetsToLeaveL2(int64_t bytes_per_set) {
  int device = 0, l2 = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
  const int64_t sets = (4 * int64_t{l2} + bytes_per_set - 1) / bytes_per_set;
  return static_cast<int>(std::clamp<int64_t>(sets, 1, kMaxSets));
}

/// A counter-based hash: uniform in [0, 1) from (seed, index), the same on every launch shape.
__device__ float UniformAt(uint64_t seed, int64_t i) {
  uint64_t x = seed ^ (static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull);
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
}

template <typename T>
__global__ void FillUniformKernel(T* out, int64_t n, uint64_t seed, float low, float high) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<T>(low + (high - low) * UniformAt(seed, i));
  }
}

template <typename T>
cudaError_t FillUniform(T* out, int64_t n, uint64_t seed, float low, float high) {
  FillUniformKernel<<<1024, 256>>>(out, n, seed, low, high);
  return cudaGetLastError();
}

/// Median seconds per launch of fn(set) over kTrials trials of kLaunchesPerTrial launches that
/// rotate over `sets` buffer sets, after one warm-up pass over every set.
template <typename Fn>
double MedianSecondsPerLaunch(int sets, CudaChecker& check, Fn fn) {
  for (int s = 0; s < sets; ++s) fn(s);
  cudaEvent_t start, stop;
  BENCH_CUDA(check, cudaEventCreate(&start));
  BENCH_CUDA(check, cudaEventCreate(&stop));
  std::vector<double> trials;
  for (int t = 0; t < kTrials && check.first == cudaSuccess; ++t) {
    BENCH_CUDA(check, cudaEventRecord(start));
    for (int i = 0; i < kLaunchesPerTrial; ++i) fn(i % sets);
    BENCH_CUDA(check, cudaEventRecord(stop));
    BENCH_CUDA(check, cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA(check, cudaEventElapsedTime(&ms, start, stop));
    trials.push_back(ms / 1e3 / kLaunchesPerTrial);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (trials.empty()) return 0;
  std::nth_element(trials.begin(), trials.begin() + trials.size() / 2, trials.end());
  return trials[trials.size() / 2];
}

/// Device-to-device copy bandwidth (read + write counted) for `bytes`, rotating as above.
double CopyBandwidth(int64_t bytes, CudaChecker& check) {
  const int sets = SetsToLeaveL2(2 * bytes);
  std::vector<void*> from(sets, nullptr), to(sets, nullptr);
  for (int s = 0; s < sets; ++s) {
    BENCH_CUDA(check, cudaMalloc(&from[s], bytes));
    BENCH_CUDA(check, cudaMalloc(&to[s], bytes));
    if (from[s]) BENCH_CUDA(check, FillUniform(static_cast<float*>(from[s]), bytes / 4, s, -1, 1));
  }
  double seconds = 0;
  if (check.first == cudaSuccess) {
    seconds = MedianSecondsPerLaunch(sets, check, [&](int s) {
      BENCH_CUDA(check, cudaMemcpyAsync(to[s], from[s], bytes, cudaMemcpyDeviceToDevice));
    });
  }
  for (int s = 0; s < sets; ++s) {
    cudaFree(from[s]);
    cudaFree(to[s]);
  }
  return seconds > 0 ? 2.0 * bytes / seconds : 0;
}

void BM_Copy_CUDA(benchmark::State& state) {
  if (!HaveDevice(state)) return;
  const int64_t bytes = state.range(0) * 4;
  CudaChecker check;
  double bandwidth = 0;
  for (auto _ : state) {
    bandwidth = CopyBandwidth(bytes, check);
    if (bandwidth > 0) state.SetIterationTime(2.0 * bytes / bandwidth);
  }
  if (check.first != cudaSuccess) return state.SkipWithError(check.message().c_str());
  state.counters["GBps"] = bandwidth / 1e9;
}

/// One set of AdamW buffers: fp32 master/m/v, the gradient and (mixed) the low-precision param.
struct AdamBuffers {
  float *master = nullptr, *m = nullptr, *v = nullptr;
  void *grad = nullptr, *param = nullptr;
};

void RunAdamW(benchmark::State& state, DType low) {
  if (!HaveDevice(state)) return;
  const int64_t n = state.range(0);
  const bool mixed = low != DType::kFP32;
  const int64_t low_bytes = mixed ? 2 : 4;
  const int sets = SetsToLeaveL2(n * (12 + 2 * low_bytes));
  CudaChecker check;
  std::vector<AdamBuffers> buffers(sets);
  for (int s = 0; s < sets && check.first == cudaSuccess; ++s) {
    AdamBuffers& b = buffers[s];
    BENCH_CUDA(check, cudaMalloc(&b.master, n * 4));
    BENCH_CUDA(check, cudaMalloc(&b.m, n * 4));
    BENCH_CUDA(check, cudaMalloc(&b.v, n * 4));
    BENCH_CUDA(check, cudaMalloc(&b.grad, n * low_bytes));
    if (mixed) BENCH_CUDA(check, cudaMalloc(&b.param, n * 2));
    if (check.first != cudaSuccess) break;
    const uint64_t seed = 1000 * (s + 1);
    BENCH_CUDA(check, FillUniform(b.master, n, seed + 1, -1, 1));
    BENCH_CUDA(check, FillUniform(b.m, n, seed + 2, -0.1f, 0.1f));
    BENCH_CUDA(check, FillUniform(b.v, n, seed + 3, 0, 0.01f));
    if (mixed) {
      BENCH_CUDA(check, FillUniform(static_cast<__nv_bfloat16*>(b.grad), n, seed + 4, -1, 1));
      BENCH_CUDA(check, FillUniform(static_cast<__nv_bfloat16*>(b.param), n, seed + 5, -1, 1));
    } else {
      BENCH_CUDA(check, FillUniform(static_cast<float*>(b.grad), n, seed + 4, -1, 1));
    }
  }
  kernels::AdamHyper hyper;
  hyper.weight_decay = 0.01f;
  Status status = absl::OkStatus();
  double seconds = 0;
  for (auto _ : state) {
    if (check.first != cudaSuccess) break;
    seconds = MedianSecondsPerLaunch(sets, check, [&](int s) {
      const AdamBuffers& b = buffers[s];
      kernels::Segment segment{b.master, b.param, b.grad, b.m, b.v, n};
      status.Update(kernels::AdamStepCuda(hyper, {low, low}, {segment}, nullptr));
    });
    state.SetIterationTime(seconds);
  }
  const double bytes = 28.0 * n;
  const double copy = check.first == cudaSuccess ? CopyBandwidth(static_cast<int64_t>(bytes / 2), check) : 0;
  for (AdamBuffers& b : buffers) {
    cudaFree(b.master);
    cudaFree(b.m);
    cudaFree(b.v);
    cudaFree(b.grad);
    cudaFree(b.param);
  }
  if (check.first != cudaSuccess) return state.SkipWithError(check.message().c_str());
  if (!status.ok()) return state.SkipWithError(std::string(status.message()).c_str());
  state.counters["GBps"] = bytes / seconds / 1e9;
  state.counters["frac_of_copy"] = bytes / seconds / copy;
  state.counters["Gparams_per_s"] = n / seconds / 1e9;
  state.counters["sets"] = sets;
}

void BM_AdamW_CUDA(benchmark::State& state) { RunAdamW(state, DType::kFP32); }
void BM_AdamW_BF16_CUDA(benchmark::State& state) { RunAdamW(state, DType::kBF16); }

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{1} << 20, (int64_t{1} << 20) + 3, int64_t{1} << 24, int64_t{1} << 27,
                    int64_t{1} << 30}) {
    b->Arg(n);
  }
  b->ArgName("n")->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Copy_CUDA)->Apply(Sizes);
BENCHMARK(BM_AdamW_CUDA)->Apply(Sizes);
BENCHMARK(BM_AdamW_BF16_CUDA)->Apply(Sizes);

}  // namespace
}  // namespace zero::bench
BENCHMARK_MAIN();
