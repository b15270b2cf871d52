// Google Benchmark under mpirun: every rank runs the same benchmarks (their collectives must
// match), only rank 0 prints.
#ifndef ZERO_BENCH_MPI_REPORTING_H_
#define ZERO_BENCH_MPI_REPORTING_H_

#include <benchmark/benchmark.h>

#include <vector>

namespace zero::bench {

/// A reporter that prints nothing: what ranks other than 0 report to.
class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

/// Runs the registered benchmarks; rank 0 reports them, every other rank stays quiet.
inline void RunSpecifiedBenchmarksOnRanks(int rank) {
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
}

}  // namespace zero::bench

#endif  // ZERO_BENCH_MPI_REPORTING_H_
