// All-reduce algorithms as rounds of non-blocking MPI calls (internal to comm/mpi; the rounds
// themselves are described in mpi_rounds.h).
//
// OpenMPI 4.1's MPI_Iallreduce is fast up to a few MiB on shared memory and collapses above
// (64 MiB: ≈ 200 ms against ≈ 10 ms for a reduce-scatter of the same buffer here;
// bench/RESULTS.md), so the communicator times it against a direct algorithm built from
// point-to-point calls and our own add, per size, as it does for the reduce-scatter.
#ifndef ZERO_COMM_MPI_MPI_ALL_REDUCE_ROUNDS_H_
#define ZERO_COMM_MPI_MPI_ALL_REDUCE_ROUNDS_H_

#include <vector>

#include "comm/mpi/mpi_rounds.h"

namespace zero::comm {

/// How an all-reduce is computed over MPI.
enum class AllReduceAlgorithm {
  kNative,  ///< MPI_Iallreduce
  kDirect,  ///< chunk p to rank p, our add of the n chunks, each sum sent back to every rank
};
/// In probe order: direct first, so a native call much slower than it is timed once, not three
/// times (mpi_tuning.h).
inline constexpr AllReduceAlgorithm kAllReduceAlgorithms[] = {AllReduceAlgorithm::kDirect,
                                                             AllReduceAlgorithm::kNative};

/// "native", "direct".
const char* AlgorithmName(AllReduceAlgorithm algorithm);

/// What one all-reduce works on: `count` elements in `send` and `recv` (the same buffer when
/// in place). The fields are those of ReduceScatterCall, with `count` the whole buffer's.
using AllReduceCall = ReduceScatterCall;

/// Bytes of temporaries the rounds of `algorithm` need for `call` cut in pieces of at most
/// `piece_bytes`.
size_t AllReduceScratchBytes(AllReduceAlgorithm algorithm, const AllReduceCall& call,
                             int64_t piece_bytes);

/// The rounds that compute `call` with `algorithm`, in pieces of at most `piece_bytes`
/// (the largest size the algorithm was measured at: OpenMPI's all-reduce collapses past it),
/// one after the other; `scratch` as for ReduceScatterRounds, AllReduceScratchBytes of one
/// piece.
/// Direct: rank r owns elements [r·count/n, (r+1)·count/n); every rank sends each owner its
/// part, the owner adds the n parts in rank order (fp32 accumulation, one rounding, so every
/// rank gets identical bits) and sends the sum back to every rank: two rounds, each rank
/// sending and receiving 2(n − 1)/n of the buffer, the minimum for an all-reduce.
std::vector<MpiRound> AllReduceRounds(AllReduceAlgorithm algorithm, const AllReduceCall& call,
                                      int64_t piece_bytes, char* scratch);

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_MPI_ALL_REDUCE_ROUNDS_H_
