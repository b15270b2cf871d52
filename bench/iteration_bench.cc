// Whole training iterations, stages 0-3, with a simulated backward: how much of the gradient
// communication hides behind backward, and what each stage costs next to stage 0.
//
//   mpirun -np 2 zero_bench_iteration        (or -np 3; in-process ranks are not timed here)
//
// The model is an MLP of `layers` Linear(width, width) layers (weight and bias; 6 × 1024 by
// default: 6.3M fp32 params, AdamW). One iteration: BeginIteration; for each layer in backward
// order: [stage 3: Gather(layer)], the layer's simulated backward (a sleep: the compute of a
// GPU, or of threads this benchmark does not model, that leaves the CPU to communication),
// AccumulateGrad for bias and weight, [stage 3: Release(layer)]; EndBackward; Step. The sleep
// per layer is backward_ms / layers. Forward is not simulated (its stage-3 gathers are the
// same as backward's).
//
// Per stage, rank 0 reports (medians over the timed iterations):
//   step_ms          BeginIteration to the end of Step
//   exposed_comm_ms  EndBackward: waiting for reductions after the last gradient, on the rank
//                    that finished backward last (per iteration, the smallest over ranks):
//                    what communication adds to the critical path. The other ranks' waits
//                    also hold the skew between ranks' backward (their sleeps overshoot by
//                    different amounts); that is exposed_max_ms, the largest over ranks.
//   step_call_ms     Step: the optimizer on this rank's shard, and at stages 1-2 the
//                    parameter all-gather
//   comm_ms          EndBackward of an iteration with backward_ms = 0 (smallest over ranks):
//                    every bucket's reduction back to back (what communication costs when
//                    nothing hides it)
//   overlap          1 − exposed_comm_ms / comm_ms: the fraction hidden behind backward
//   bucket_rs_ms     one reduce-scatter of the stage's largest bucket on the same
//                    communicator, right after the iterations, with the caches flushed
//                    first: in training the compute between two reductions evicts their
//                    buffers (this benchmark's sleep does not; on this machine a cache-warm
//                    repeat of the same reduce-scatter is ~1.5× faster)
//   exposed_vs_bucket  exposed_comm_ms / bucket_rs_ms (≤ 1: only one bucket's reduction is
//                    left exposed after backward)
//   vs_stage0        step_ms / stage 0's step_ms measured earlier in the same run
// Arguments: stage, backward_ms, bucket (reduce_bucket_elems in units of 1M elements; 0: the
// config default). Every rank runs the same fixed iteration counts.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/mpi_reporting.h"
#include "zero/communicator.h"
#include "zero/engine.h"

namespace zero::bench {
namespace {

constexpr int kLayers = 6;
constexpr int64_t kWidth = 1024;
constexpr int kWarmupIterations = 2;
constexpr int kTimedIterations = 9;
constexpr size_t kCacheFlushBytes = size_t{256} << 20;  // well above any L3 this runs on

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// Writes a buffer larger than the caches, so the next collective finds its buffers in memory.
void FlushCaches() {
  static std::vector<char> evictor(kCacheFlushBytes);
  for (size_t i = 0; i < evictor.size(); i += 64) evictor[i] = static_cast<char>(evictor[i] + 1);
}

// One reduce-scatter of the largest bucket the plan makes at `stage` under `bucket_elems` (the
// config default when 0), median of kTimedIterations, each after a cache flush and a barrier.
// Stages 0-2 fill a bucket with whole layers up to the cap, or a weight alone when a layer
// does not fit; stage 3 makes one bucket per layer (its unit).
StatusOr<double> LargestBucketReduceScatterMs(comm::Communicator& comm, int stage, int64_t bucket_elems) {
  const int64_t layer = kWidth * kWidth + kWidth;
  const int64_t cap = bucket_elems > 0 ? bucket_elems : Config().buckets.reduce_bucket_elems;
  const int64_t layers = stage == 3 ? 1 : cap / layer;
  const int64_t largest = layers > 0 ? layers * layer : kWidth * kWidth;
  const int64_t pad = comm.size() * 128;
  const int64_t numel = (largest + pad - 1) / pad * pad;
  std::vector<float> send(numel, 1e-3f), recv(numel / comm.size());
  std::vector<double> times;
  for (int i = 0; i < kTimedIterations; ++i) {
    FlushCaches();
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    ZERO_RETURN_IF_ERROR(comm.ReduceScatter(send.data(), recv.data(), numel / comm.size(), DType::kFP32,
                                            comm::ReduceOp::kSum)->Wait(60));
    times.push_back(MillisecondsSince(start));
  }
  return Median(times);
}

struct Timings {
  double step_ms = 0, exposed_ms = 0, step_call_ms = 0;
};

// One engine with the MLP registered and initialised.
class Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Create(comm::Communicator& comm, int stage, int64_t bucket_elems) {
    Config config;
    config.stage = stage;
    config.optimizer.type = OptimizerType::kAdamW;
    if (bucket_elems > 0) config.buckets.reduce_bucket_elems = bucket_elems;
    auto model = std::make_unique<Model>();
    ZERO_ASSIGN_OR_RETURN(model->engine_, Engine::Create(config, comm));
    for (int l = 0; l < kLayers; ++l) {
      const std::string name = "layer" + std::to_string(l);
      ZERO_ASSIGN_OR_RETURN(ParamId w, model->engine_->RegisterParam(
                                           {name + ".weight", {kWidth, kWidth}, DType::kFP32, true, 0, l}));
      ZERO_ASSIGN_OR_RETURN(ParamId b, model->engine_->RegisterParam(
                                           {name + ".bias", {kWidth}, DType::kFP32, true, 0, l}));
      model->weights_.push_back(w);
      model->biases_.push_back(b);
    }
    ZERO_RETURN_IF_ERROR(model->engine_->Finalize());
    model->weight_grad_.assign(kWidth * kWidth, 1e-3f);
    model->bias_grad_.assign(kWidth, 1e-3f);
    std::vector<float> init(kWidth * kWidth, 0.01f);
    for (int l = 0; l < kLayers; ++l) {
      ZERO_RETURN_IF_ERROR(model->engine_->SetParam(model->weights_[l], init.data()));
      ZERO_RETURN_IF_ERROR(model->engine_->SetParam(model->biases_[l], init.data()));
    }
    model->stage_ = stage;
    return model;
  }

  // One iteration; `backward_ms` of simulated compute spread over the layers.
  StatusOr<Timings> Iterate(double backward_ms) {
    Timings t;
    const auto start = std::chrono::steady_clock::now();
    ZERO_RETURN_IF_ERROR(engine_->BeginIteration());
    const auto per_layer = std::chrono::duration<double, std::milli>(backward_ms / kLayers);
    for (int l = kLayers - 1; l >= 0; --l) {
      if (stage_ == 3) ZERO_RETURN_IF_ERROR(engine_->Gather(l));
      if (backward_ms > 0) std::this_thread::sleep_for(per_layer);
      ZERO_RETURN_IF_ERROR(engine_->AccumulateGrad(biases_[l], bias_grad_.data()));
      ZERO_RETURN_IF_ERROR(engine_->AccumulateGrad(weights_[l], weight_grad_.data()));
      if (stage_ == 3) ZERO_RETURN_IF_ERROR(engine_->Release(l));
    }
    const auto end_backward = std::chrono::steady_clock::now();
    ZERO_RETURN_IF_ERROR(engine_->EndBackward());
    t.exposed_ms = MillisecondsSince(end_backward);
    const auto step = std::chrono::steady_clock::now();
    ZERO_RETURN_IF_ERROR(engine_->Step().status());
    t.step_call_ms = MillisecondsSince(step);
    t.step_ms = MillisecondsSince(start);
    return t;
  }

 private:
  std::unique_ptr<Engine> engine_;
  std::vector<ParamId> weights_, biases_;
  std::vector<float> weight_grad_, bias_grad_;
  int stage_ = 0;
};

// Stage 0's step_ms per (backward_ms, bucket) of this run, for vs_stage0 (stage 0 runs first).
using StageZeroSteps = std::map<std::pair<int64_t, int64_t>, double>;

void BM_Iteration(benchmark::State& state, comm::Communicator* comm, StageZeroSteps* stage0) {
  const int stage = static_cast<int>(state.range(0));
  const double backward_ms = static_cast<double>(state.range(1));
  const int64_t bucket_elems = state.range(2) * (int64_t{1} << 20);
  auto model = Model::Create(*comm, stage, bucket_elems);
  if (!model.ok()) {
    state.SkipWithError(std::string(model.status().message()).c_str());
    return;
  }
  std::vector<double> steps, exposed, exposed_max, step_calls, comm_only;
  auto run = [&](double compute, bool keep) -> bool {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t = (*model)->Iterate(compute);
    if (!t.ok()) {
      state.SkipWithError(std::string(t.status().message()).c_str());
      return false;
    }
    double least = t->exposed_ms, most = t->exposed_ms;
    MPI_Allreduce(MPI_IN_PLACE, &least, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (keep && compute > 0) {
      steps.push_back(t->step_ms);
      exposed.push_back(least);
      exposed_max.push_back(most);
      step_calls.push_back(t->step_call_ms);
    } else if (keep) {
      comm_only.push_back(least);
    }
    return true;
  };
  for (auto _ : state) {
    for (int i = 0; i < kWarmupIterations; ++i) {
      if (!run(backward_ms, false)) return;
    }
    for (int i = 0; i < kTimedIterations; ++i) {
      if (!run(backward_ms, true) || !run(0, true)) return;
    }
  }
  auto bucket_rs_ms = LargestBucketReduceScatterMs(*comm, stage, bucket_elems);
  if (!bucket_rs_ms.ok()) {
    state.SkipWithError(std::string(bucket_rs_ms.status().message()).c_str());
    return;
  }
  const double step_ms = Median(steps), exposed_ms = Median(exposed), comm_ms = Median(comm_only);
  state.counters["step_ms"] = step_ms;
  state.counters["exposed_comm_ms"] = exposed_ms;
  state.counters["exposed_max_ms"] = Median(exposed_max);
  state.counters["step_call_ms"] = Median(step_calls);
  state.counters["comm_ms"] = comm_ms;
  state.counters["overlap"] = comm_ms > 0 ? std::max(0.0, 1.0 - exposed_ms / comm_ms) : 1.0;
  state.counters["bucket_rs_ms"] = *bucket_rs_ms;
  state.counters["exposed_vs_bucket"] = exposed_ms / *bucket_rs_ms;
  state.counters["ranks"] = comm->size();
  const auto key = std::make_pair(state.range(1), state.range(2));
  if (stage == 0) (*stage0)[key] = step_ms;
  if (stage0->count(key)) state.counters["vs_stage0"] = step_ms / stage0->at(key);
}

}  // namespace
}  // namespace zero::bench

int main(int argc, char** argv) {
  using namespace zero::bench;
  benchmark::Initialize(&argc, argv);
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) {
    std::fprintf(stderr, "zero_bench_iteration runs under mpirun: mpirun -np 2 %s\n", argv[0]);
    return 2;
  }
  auto created = zero::comm::CreateMpiCommunicator(nullptr);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<zero::comm::Communicator> world = std::move(*created);
  // Every stage at the default buckets, then at 4M- and 1M-element buckets.
  StageZeroSteps stage0;
  auto* b = benchmark::RegisterBenchmark("BM_Iteration", BM_Iteration, world.get(), &stage0);
  for (int64_t bucket : {0, 4, 1}) {
    for (int stage : {0, 1, 2, 3}) b->Args({stage, 60, bucket});
  }
  b->ArgNames({"stage", "backward_ms", "bucket_M"})->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
  RunSpecifiedBenchmarksOnRanks(world->rank());
  benchmark::Shutdown();
  world.reset();
  return 0;
}
