// Communicator bandwidth, nccl-tests definitions: algbw = bytes per rank's full buffer / time;
// busbw = algbw · (n−1)/n for reduce-scatter and all-gather, · 2(n−1)/n for all-reduce.
//
//   zero_bench_comm                       in-process ranks (local backend), 2-4 ranks
//   mpirun -np N zero_bench_comm          the mpi backend; every MPI benchmark first times the
//                                         raw blocking MPI call on the same bytes in the same
//                                         run and reports `ratio_to_raw` = raw time / ours.
//                                         Reduce-scatter has two raw ways: MPI_Reduce_scatter_block
//                                         (raw_rsb_ms) and MPI_Iallreduce keeping this rank's
//                                         shard (raw_allreduce_ms); the ratio is to the faster.
//                                         BM_HostValues_MPI: a few values summed, untagged and
//                                         tagged as the engine's host values.
// Under mpirun only rank 0 prints. MPI benchmarks use fixed iteration counts so every rank
// runs the same number of collectives.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "bench/mpi_reporting.h"
#include "comm/mpi/mpi_rounds.h"
#include "zero/communicator.h"

namespace zero::bench {
namespace {

using comm::CollectiveKind;
using comm::Communicator;
using comm::ReduceOp;

// Bytes of the full (size × chunk) buffer and the bus-bandwidth factor of each collective.
double BusFactor(CollectiveKind kind, int ranks) {
  const double n = ranks;
  return kind == CollectiveKind::kAllReduce ? 2 * (n - 1) / n : (n - 1) / n;
}

// One collective on `comm` over a full buffer of `elements` floats; waits for it.
Status RunCollective(Communicator& comm, CollectiveKind kind, std::vector<float>& full,
                     std::vector<float>& part) {
  const int64_t chunk = static_cast<int64_t>(part.size());
  switch (kind) {
    case CollectiveKind::kReduceScatter:
      return comm.ReduceScatter(full.data(), part.data(), chunk, DType::kFP32, ReduceOp::kSum)->Wait();
    case CollectiveKind::kAllGather:
      return comm.AllGather(part.data(), full.data(), chunk, DType::kFP32)->Wait();
    default:
      return comm.AllReduce(full.data(), full.data(), static_cast<int64_t>(full.size()),
                            DType::kFP32, ReduceOp::kSum)
          ->Wait();
  }
}

void SetBandwidth(benchmark::State& state, CollectiveKind kind, int ranks, double bytes,
                  double seconds_per_op) {
  const double algbw = bytes / seconds_per_op;
  state.counters["algbw_GBps"] = algbw / 1e9;
  state.counters["busbw_GBps"] = algbw * BusFactor(kind, ranks) / 1e9;
  state.counters["ranks"] = ranks;
}

// Local backend: this thread is rank 0; helper threads run ranks 1..n-1 in lockstep.
void BM_Local(benchmark::State& state, CollectiveKind kind) {
  const int ranks = static_cast<int>(state.range(1));
  const int64_t elements = state.range(0) / 4 / ranks * ranks;
  const int64_t iterations = static_cast<int64_t>(state.max_iterations);
  auto group = comm::CreateLocalGroup(ranks);
  std::vector<std::thread> helpers;
  for (int r = 1; r < ranks; ++r) {
    helpers.emplace_back([&, r] {
      std::vector<float> full(elements, 1.0f), part(elements / ranks, 1.0f);
      for (int64_t i = 0; i < iterations; ++i) (void)RunCollective(*(*group)[r], kind, full, part);
    });
  }
  std::vector<float> full(elements, 1.0f), part(elements / ranks, 1.0f);
  for (auto _ : state) {
    const Status status = RunCollective(*(*group)[0], kind, full, part);
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
  }
  for (auto& t : helpers) t.join();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * elements * 4);
  state.counters["busbw_GBps"] = benchmark::Counter(
      BusFactor(kind, ranks) * elements * 4.0, benchmark::Counter::kIsIterationInvariantRate,
      benchmark::Counter::kIs1000);
  state.counters["ranks"] = ranks;
}

// The other raw way to a reduce-scatter: the non-blocking all-reduce of the whole buffer into
// `scratch` (kept across calls), then this rank's shard copied out.
void RawAllReduceKeepShard(std::vector<float>& full, std::vector<float>& part,
                           std::vector<float>& scratch) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Request request;
  MPI_Iallreduce(full.data(), scratch.data(), static_cast<int>(full.size()), MPI_FLOAT, MPI_SUM,
                 MPI_COMM_WORLD, &request);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
  std::copy(scratch.begin() + static_cast<int64_t>(rank) * part.size(),
            scratch.begin() + static_cast<int64_t>(rank + 1) * part.size(), part.begin());
}

// Our ring's rounds run blocking on this thread (no progress thread, no hand-off): what the
// communicator's reduce-scatter costs without the thread that runs it in the background.
void RingOnThisThread(std::vector<float>& full, std::vector<float>& part, std::vector<char>& scratch) {
  comm::ReduceScatterCall call;
  call.send = full.data();
  call.recv = part.data();
  call.count = static_cast<int64_t>(part.size());
  call.comm = MPI_COMM_WORLD;
  MPI_Comm_rank(MPI_COMM_WORLD, &call.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &call.size);
  call.tag = 31000;
  const auto algorithm = comm::ReduceScatterAlgorithm::kRing;
  scratch.resize(comm::ReduceScatterScratchBytes(algorithm, call));
  comm::RunRoundsBlocking(comm::ReduceScatterRounds(algorithm, call, scratch.data()));
}

// Seconds per call of `call`, after one warm-up, over `iterations` calls.
template <typename Call>
double TimeRaw(int64_t iterations, Call call) {
  call();
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int64_t i = 0; i < iterations; ++i) call();
  return (MPI_Wtime() - start) / iterations;
}

// The raw blocking MPI call on the same bytes, for the ratio.
void RawMpi(CollectiveKind kind, std::vector<float>& full, std::vector<float>& part) {
  const int chunk = static_cast<int>(part.size());
  switch (kind) {
    case CollectiveKind::kReduceScatter:
      MPI_Reduce_scatter_block(full.data(), part.data(), chunk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      return;
    case CollectiveKind::kAllGather:
      MPI_Allgather(part.data(), chunk, MPI_FLOAT, full.data(), chunk, MPI_FLOAT, MPI_COMM_WORLD);
      return;
    default:
      MPI_Allreduce(MPI_IN_PLACE, full.data(), static_cast<int>(full.size()), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      return;
  }
}

void BM_Mpi(benchmark::State& state, Communicator* comm, CollectiveKind kind) {
  const int ranks = comm->size();
  const int64_t elements = state.range(0) / 4 / ranks * ranks;
  std::vector<float> full(elements, 1.0f), part(elements / ranks, 1.0f);
  const int64_t iterations = static_cast<int64_t>(state.max_iterations);
  double raw_seconds = TimeRaw(iterations, [&] { RawMpi(kind, full, part); });
  if (kind == CollectiveKind::kReduceScatter) {
    std::vector<float> scratch(full.size());
    const double raw_allreduce = TimeRaw(iterations, [&] { RawAllReduceKeepShard(full, part, scratch); });
    state.counters["raw_rsb_ms"] = raw_seconds * 1e3;
    state.counters["raw_allreduce_ms"] = raw_allreduce * 1e3;
    std::vector<char> ring_scratch;
    state.counters["ring_on_caller_ms"] =
        TimeRaw(iterations, [&] { RingOnThisThread(full, part, ring_scratch); }) * 1e3;
    raw_seconds = std::min(raw_seconds, raw_allreduce);
  }
  (void)RunCollective(*comm, kind, full, part);  // warm-up
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (auto _ : state) {
    const Status status = RunCollective(*comm, kind, full, part);
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
  }
  const double seconds = (MPI_Wtime() - start) / iterations;
  SetBandwidth(state, kind, ranks, elements * 4.0, seconds);
  state.counters["raw_busbw_GBps"] = elements * 4.0 / raw_seconds * BusFactor(kind, ranks) / 1e9;
  state.counters["ratio_to_raw"] = raw_seconds / seconds;
}

// A few host values (a gradient norm, flags) summed over the ranks: untagged, as a gradient
// bucket's collective, or tagged kHostValuesTag, as the engine sends them (the MPI backend then
// first all-gathers every rank's signature and runs the collective on its tagged duplicate).
// The roofline is the raw blocking MPI_Allreduce of the same values in the same run.
void BM_MpiValues(benchmark::State& state, Communicator* comm, bool tagged) {
  std::vector<float> values(static_cast<size_t>(state.range(0)), 1.0f);
  const int64_t count = state.range(0);
  const int64_t iterations = static_cast<int64_t>(state.max_iterations);
  const double raw_seconds = TimeRaw(iterations, [&] {
    MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  });
  auto run = [&] {
    return comm->AllReduce(values.data(), values.data(), count, DType::kFP32, ReduceOp::kSum,
                           tagged ? comm::kHostValuesTag : -1)
        ->Wait();
  };
  (void)run();  // warm-up
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (auto _ : state) {
    const Status status = run();
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
  }
  const double seconds = (MPI_Wtime() - start) / iterations;
  state.counters["us"] = seconds * 1e6;
  state.counters["raw_us"] = raw_seconds * 1e6;
  state.counters["ratio_to_raw"] = raw_seconds / seconds;
}

const char* Name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kReduceScatter: return "ReduceScatter";
    case CollectiveKind::kAllGather: return "AllGather";
    default: return "AllReduce";
  }
}

}  // namespace
}  // namespace zero::bench

int main(int argc, char** argv) {
  using namespace zero::bench;
  using zero::comm::CollectiveKind;
  benchmark::Initialize(&argc, argv);
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  const CollectiveKind kinds[] = {CollectiveKind::kReduceScatter, CollectiveKind::kAllGather,
                                  CollectiveKind::kAllReduce};
  std::unique_ptr<zero::comm::Communicator> world;
  if (under_mpirun) {
    auto created = zero::comm::CreateMpiCommunicator(nullptr);
    if (!created.ok()) {
      fprintf(stderr, "%s\n", created.status().ToString().c_str());
      return 1;
    }
    world = std::move(*created);
    for (CollectiveKind kind : kinds) {
      auto* b = benchmark::RegisterBenchmark((std::string("BM_") + Name(kind) + "_MPI").c_str(),
                                             BM_Mpi, world.get(), kind);
      for (int64_t bytes : {int64_t{1} << 20, int64_t{1} << 24, int64_t{1} << 26}) b->Arg(bytes);
      b->ArgName("bytes")->Iterations(20)->UseRealTime()->Unit(benchmark::kMillisecond);
    }
    for (bool tagged : {false, true}) {
      benchmark::RegisterBenchmark(tagged ? "BM_HostValues_MPI/tagged" : "BM_HostValues_MPI/untagged",
                                   BM_MpiValues, world.get(), tagged)
          ->Arg(2)
          ->ArgName("values")
          ->Iterations(2000)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  } else {
    for (CollectiveKind kind : kinds) {
      auto* b = benchmark::RegisterBenchmark((std::string("BM_") + Name(kind) + "_Local").c_str(),
                                             BM_Local, kind);
      for (int ranks : {2, 3, 4}) {
        for (int64_t bytes : {int64_t{1} << 20, int64_t{1} << 24}) b->Args({bytes, ranks});
      }
      b->ArgNames({"bytes", "ranks"})->Iterations(10)->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  }
  RunSpecifiedBenchmarksOnRanks(world == nullptr ? 0 : world->rank());
  benchmark::Shutdown();
  world.reset();
  return 0;
}
