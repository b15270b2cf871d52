// A collective as rounds of non-blocking MPI calls, and the reduce-scatter algorithms built
// that way (internal to comm/mpi).
//
// The progress thread runs a collective round by round: a round does its local work (a copy,
// a reduction of what the previous round received), then starts non-blocking MPI calls; when
// they have all completed the next round starts. A one-call collective (MPI_Iallgather...) is
// one round. The same rounds run blocking in RunRoundsBlocking, which is how the tuner
// (mpi_tuning.h) times exactly what the communicator will run.
#ifndef ZERO_COMM_MPI_MPI_ROUNDS_H_
#define ZERO_COMM_MPI_MPI_ROUNDS_H_

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "zero/communicator.h"

namespace zero::comm {

/// One round: local work, then the non-blocking MPI calls it starts, appended to `requests`
/// (none is fine). Returns an MPI error code (MPI_SUCCESS when all went well).
using MpiRound = std::function<int(std::vector<MPI_Request>* requests)>;

/// How a reduce-scatter is computed over MPI.
enum class ReduceScatterAlgorithm {
  kNative,     ///< MPI_Ireduce_scatter_block
  kAllReduce,  ///< MPI_Iallreduce into a full-size temporary, keep this rank's chunk
  kRing,       ///< size − 1 rounds of point-to-point with the right/left neighbour, our add
  kDirect,     ///< one round: every chunk sent straight to its owner, then our add of n chunks
};
inline constexpr ReduceScatterAlgorithm kReduceScatterAlgorithms[] = {
    ReduceScatterAlgorithm::kRing, ReduceScatterAlgorithm::kDirect,
    ReduceScatterAlgorithm::kAllReduce, ReduceScatterAlgorithm::kNative};

/// "native", "allreduce", "ring", "direct".
const char* AlgorithmName(ReduceScatterAlgorithm algorithm);

/// What one reduce-scatter works on: `count` elements per rank, `send` holds size × count,
/// `recv` count (it may be `send`'s own chunk, in place).
struct ReduceScatterCall {
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;
  DType dtype = DType::kFP32;
  ReduceOp op = ReduceOp::kSum;
  MPI_Datatype mpi_type = MPI_FLOAT;  ///< how MPI sees one element
  MPI_Op mpi_op = MPI_SUM;            ///< the reduction for MPI's own collectives
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int tag = 0;  ///< point-to-point tag, unique among this communicator's collectives in flight
};

/// The algorithm that actually runs: `algorithm`, unless it cannot take `call` (the all-reduce
/// counts size × count elements in one int; past INT_MAX, the ring).
ReduceScatterAlgorithm EffectiveAlgorithm(ReduceScatterAlgorithm algorithm,
                                          const ReduceScatterCall& call);

/// Bytes of temporaries the rounds of `algorithm` need for `call`.
size_t ReduceScatterScratchBytes(ReduceScatterAlgorithm algorithm, const ReduceScatterCall& call);

/// The rounds that compute `call` with `algorithm`. Temporaries go in `scratch`
/// (ReduceScatterScratchBytes long, uninitialised is fine), which must stay alive until the
/// rounds have completed (or forever, once abandoned). Reuse it across calls: fresh memory
/// costs a page fault per page, which made a 16 MiB reduce-scatter 10× slower here.
std::vector<MpiRound> ReduceScatterRounds(ReduceScatterAlgorithm algorithm,
                                          const ReduceScatterCall& call, char* scratch);

/// Runs `rounds` to completion on the calling thread (MPI_Waitall after each round).
int RunRoundsBlocking(const std::vector<MpiRound>& rounds);

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_MPI_ROUNDS_H_
