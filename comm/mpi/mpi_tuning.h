// The reduce-scatter and all-reduce algorithms per message size, measured once when an MPI
// communicator is created (internal to comm/mpi).
//
// OpenMPI's collectives are far slower than what the same transport can do in some sizes
// (over shared memory, 16 MiB: MPI_Reduce_scatter_block ≈ 53 ms against ≈ 2 ms for our own
// point-to-point algorithms; 64 MiB: MPI_Iallreduce ≈ 200 ms; bench/RESULTS.md). Which way
// wins depends on the MPI, the transport, the rank count and the size, so the communicator
// times each algorithm of mpi_rounds.h and mpi_all_reduce_rounds.h at a few sizes on its own
// ranks and keeps the fastest for each size range.
//
//   ZERO_MPI_REDUCE_SCATTER = auto (default) | ring | direct | allreduce | native
//   ZERO_MPI_ALL_REDUCE     = auto (default) | native | direct
//
// (read with the other tunables, base/env.h) force one algorithm for every size, with no
// measurement; the choices are logged at INFO.
#ifndef ZERO_COMM_MPI_MPI_TUNING_H_
#define ZERO_COMM_MPI_MPI_TUNING_H_

#include <mpi.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/mpi/mpi_all_reduce_rounds.h"
#include "comm/mpi/mpi_rounds.h"
#include "zero/status.h"

namespace zero::comm {

/// Probe sizes (bytes of the whole buffer: size × count elements for a reduce-scatter, count
/// for an all-reduce): each range is the probe size's neighbourhood, split at geometric means.
inline constexpr int kProbeRanges = 3;
inline constexpr int64_t kProbeBytes[kProbeRanges] = {int64_t{64} << 10, int64_t{1} << 20,
                                                      int64_t{16} << 20};

/// The probe range of a buffer of `total_bytes`.
int ProbeRange(int64_t total_bytes);

/// Size ranges and their algorithm (ReduceScatterAlgorithm or AllReduceAlgorithm).
template <typename Algorithm>
class AlgorithmChoice {
 public:
  AlgorithmChoice() = default;
  /// `algorithms[i]` for range i, described by `description` (see description()).
  AlgorithmChoice(const std::array<Algorithm, kProbeRanges>& algorithms, std::string description)
      : algorithm_(algorithms), description_(std::move(description)) {}

  /// The same algorithm for every size.
  static AlgorithmChoice Fixed(Algorithm algorithm) {
    std::array<Algorithm, kProbeRanges> every;
    every.fill(algorithm);
    return AlgorithmChoice(every, absl::StrCat(AlgorithmName(algorithm), " (forced)"));
  }

  /// The algorithm for a buffer of `total_bytes`.
  Algorithm For(int64_t total_bytes) const { return algorithm_[ProbeRange(total_bytes)]; }

  /// "64 KiB: ring (ring 0.010 ms, direct 0.011 ms, ...); 1 MiB: ..." (the probe size of each
  /// range, the winner, every timing), or "ring (forced)".
  const std::string& description() const { return description_; }

 private:
  std::array<Algorithm, kProbeRanges> algorithm_ = {};
  std::string description_;
};

using ReduceScatterChoice = AlgorithmChoice<ReduceScatterAlgorithm>;
using AllReduceChoice = AlgorithmChoice<AllReduceAlgorithm>;

/// Times every algorithm at each probe size on `comm` (collective: every rank calls it, before
/// any other traffic) and keeps the fastest per range. Every rank gets the same choice: each
/// timing is the slowest rank's. Each algorithm runs once untimed, then up to 3 timed runs;
/// one more than 2× slower than the best so far at a size is not timed again there, so the
/// probe costs a few runs of the best algorithm plus two of each slow one (at 16 MiB and 2
/// ranks here: about 0.3 s, most of it OpenMPI's own reduce-scatter). The probe times fp32
/// sums; the choice applies to every dtype and op. An MPI error during the probe returns
/// here on the rank that saw it; its peers may then wait in the probe's next collective.
StatusOr<ReduceScatterChoice> MeasureReduceScatter(MPI_Comm comm, int rank, int size);

/// The same for the all-reduce algorithms (the probe sizes are the whole buffer's).
StatusOr<AllReduceChoice> MeasureAllReduce(MPI_Comm comm, int rank, int size);

/// Both collectives' algorithms for the communicator `comm` (collective): each forced by its
/// environment variable (which must be the same on every rank, else kInvalidArgument), or
/// measured; logged at INFO.
Status ChooseAlgorithms(MPI_Comm comm, int rank, int size, ReduceScatterChoice* reduce_scatter,
                        AllReduceChoice* all_reduce);

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_MPI_TUNING_H_
