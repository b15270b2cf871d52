// The reduce-scatter algorithm per message size, measured once when an MPI communicator is
// created (internal to comm/mpi).
//
// OpenMPI's reduce-scatter is far slower than what the same transport can do (over shared
// memory, 16 MiB: MPI_Reduce_scatter_block ≈ 53 ms, MPI_Iallreduce ≈ 2.6 ms, a ring of
// point-to-point steps ≈ 2.3 ms; bench/RESULTS.md). Which way wins depends on the MPI, the
// transport, the rank count and the size, so the communicator times each algorithm of
// mpi_rounds.h at a few sizes on its own ranks and keeps the fastest for each size range.
//
//   ZERO_MPI_REDUCE_SCATTER = auto (default) | ring | direct | allreduce | native
//
// (read with the other tunables, base/env.h) forces one algorithm for every size, with
// no measurement; the choice is logged at INFO.
#ifndef ZERO_COMM_MPI_MPI_TUNING_H_
#define ZERO_COMM_MPI_MPI_TUNING_H_

#include <mpi.h>

#include <cstdint>
#include <string>

#include "comm/mpi/mpi_rounds.h"
#include "zero/status.h"

namespace zero::comm {

/// Size ranges (bytes of the whole send buffer, size × count elements) and their algorithm.
class ReduceScatterChoice {
 public:
  /// Probe sizes: each range is the probe size's neighbourhood, split at geometric means.
  static constexpr int kRanges = 3;
  static constexpr int64_t kProbeBytes[kRanges] = {int64_t{64} << 10, int64_t{1} << 20,
                                                   int64_t{16} << 20};

  /// The same algorithm for every size.
  static ReduceScatterChoice Fixed(ReduceScatterAlgorithm algorithm);

  /// The algorithm for a reduce-scatter whose send buffer holds `total_bytes`.
  ReduceScatterAlgorithm For(int64_t total_bytes) const;

  /// "64 KiB: ring (ring 0.010 ms, allreduce 0.023 ms, native 0.259 ms); 1 MiB: ..." (the
  /// probe size of each range, the winner, every timing), or "ring (forced)".
  const std::string& description() const { return description_; }

 private:
  friend StatusOr<ReduceScatterChoice> MeasureReduceScatter(MPI_Comm, int, int);
  ReduceScatterAlgorithm algorithm_[kRanges] = {};
  std::string description_;
};

/// Times every algorithm at each probe size on `comm` (collective: every rank calls it, before
/// any other traffic) and keeps the fastest per range. Every rank gets the same choice: each
/// timing is the slowest rank's. Each algorithm runs once untimed, then up to 3 timed runs;
/// one more than 2× slower than the best so far at a size is not timed again there, so the
/// probe costs a few runs of the best algorithm plus two of each slow one (at 16 MiB and 2
/// ranks here: about 0.3 s, most of it OpenMPI's own reduce-scatter). The probe times fp32
/// sums; the choice applies to every dtype and op. An MPI error during the probe returns
/// here on the rank that saw it; its peers may then wait in the probe's next collective.
StatusOr<ReduceScatterChoice> MeasureReduceScatter(MPI_Comm comm, int rank, int size);

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_MPI_TUNING_H_
