// All-reduce algorithms as rounds of non-blocking MPI calls.
#include "comm/mpi/mpi_all_reduce_rounds.h"

#include <algorithm>

#include "comm/host_reduce.h"

namespace zero::comm {
namespace {

// Elements per piece: at most `piece_bytes` worth, at least one.
int64_t PieceCount(const AllReduceCall& c, int64_t piece_bytes) {
  return std::max<int64_t>(1, piece_bytes / static_cast<int64_t>(DTypeSize(c.dtype)));
}

// Rank p's part of `count` elements: [Begin(p), Begin(p + 1)).
int64_t Begin(const AllReduceCall& c, int p) { return c.count * p / c.size; }
int64_t PartCount(const AllReduceCall& c, int p) { return Begin(c, p + 1) - Begin(c, p); }

// Every piece's MPI_Iallreduce, started together in one round: MPI matches collectives by the
// order they are started, and the progress thread starts later operations while this one
// runs, so a collective call in a later round could be started in a different order on
// different ranks.
std::vector<MpiRound> NativeRounds(const AllReduceCall& c, int64_t per_piece) {
  return {[c, per_piece](std::vector<MPI_Request>* requests) {
    const size_t element = DTypeSize(c.dtype);
    const bool in_place = c.send == c.recv;
    for (int64_t first = 0; first == 0 || first < c.count; first += per_piece) {
      const int64_t count = std::min(per_piece, c.count - first);
      const size_t offset = static_cast<size_t>(first) * element;
      void* recv = static_cast<char*>(c.recv) + offset;
      const void* source = in_place ? MPI_IN_PLACE : static_cast<const char*>(c.send) + offset;
      requests->push_back(MPI_REQUEST_NULL);
      const int rc = MPI_Iallreduce(source, recv, static_cast<int>(count), c.mpi_type, c.mpi_op,
                                    c.comm, &requests->back());
      if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
  }};
}

std::vector<MpiRound> DirectRounds(const AllReduceCall& c, char* scratch) {
  const size_t element = DTypeSize(c.dtype);
  const int n = c.size, r = c.rank;
  const int64_t mine = PartCount(c, r);
  auto at = [element](const void* base, int64_t index) {
    return static_cast<char*>(const_cast<void*>(base)) + static_cast<size_t>(index) * element;
  };
  // Slot of peer p's contribution to this rank's part: peers in rank order, this rank skipped.
  auto slot = [scratch, element, mine, r](int p) {
    return scratch + static_cast<size_t>(p < r ? p : p - 1) * static_cast<size_t>(mine) * element;
  };
  std::vector<MpiRound> rounds;
  rounds.push_back([c, n, r, mine, at, slot](std::vector<MPI_Request>* requests) {
    for (int step = 1; step < n; ++step) {
      const int peer = (r + n - step) % n;
      requests->push_back(MPI_REQUEST_NULL);
      const int rc = MPI_Irecv(slot(peer), static_cast<int>(mine), c.mpi_type, peer, c.tag, c.comm,
                               &requests->back());
      if (rc != MPI_SUCCESS) return rc;
    }
    for (int step = 1; step < n; ++step) {
      const int peer = (r + step) % n;
      requests->push_back(MPI_REQUEST_NULL);
      const int rc = MPI_Isend(at(c.send, Begin(c, peer)), static_cast<int>(PartCount(c, peer)),
                               c.mpi_type, peer, c.tag, c.comm, &requests->back());
      if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
  });
  // Sum this rank's part (in place is fine: block-wise), then exchange the sums. In place,
  // the parts received here overwrite input that round 0 has finished sending.
  rounds.push_back([c, n, r, mine, at, slot](std::vector<MPI_Request>* requests) {
    std::vector<const void*> inputs(static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) inputs[p] = p == r ? at(c.send, Begin(c, r)) : slot(p);
    char* sum = at(c.recv, Begin(c, r));
    ReduceInto(sum, inputs.data(), n, mine, c.dtype, c.op);
    for (int step = 1; step < n; ++step) {
      const int peer = (r + n - step) % n;
      requests->push_back(MPI_REQUEST_NULL);
      const int rc = MPI_Irecv(at(c.recv, Begin(c, peer)), static_cast<int>(PartCount(c, peer)),
                               c.mpi_type, peer, c.tag, c.comm, &requests->back());
      if (rc != MPI_SUCCESS) return rc;
    }
    for (int step = 1; step < n; ++step) {
      requests->push_back(MPI_REQUEST_NULL);
      const int rc = MPI_Isend(sum, static_cast<int>(mine), c.mpi_type, (r + step) % n, c.tag,
                               c.comm, &requests->back());
      if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
  });
  return rounds;
}

}  // namespace

const char* AlgorithmName(AllReduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllReduceAlgorithm::kNative: return "native";
    case AllReduceAlgorithm::kDirect: return "direct";
  }
  return "?";
}

size_t AllReduceScratchBytes(AllReduceAlgorithm algorithm, const AllReduceCall& call,
                             int64_t piece_bytes) {
  if (algorithm == AllReduceAlgorithm::kNative) return 0;
  // A part of a piece of c elements holds at most ⌈c/n⌉ (a shorter last piece may give this
  // rank a larger part than the first piece does: parts are not monotonic in c).
  const int64_t longest_piece = std::min(call.count, PieceCount(call, piece_bytes));
  const int64_t longest_part = (longest_piece + call.size - 1) / call.size;
  return static_cast<size_t>(call.size - 1) * static_cast<size_t>(longest_part) *
         DTypeSize(call.dtype);
}

std::vector<MpiRound> AllReduceRounds(AllReduceAlgorithm algorithm, const AllReduceCall& call,
                                      int64_t piece_bytes, char* scratch) {
  const int64_t per_piece = PieceCount(call, piece_bytes);
  if (algorithm == AllReduceAlgorithm::kNative) return NativeRounds(call, per_piece);
  // Direct: pieces one after the other, one tag for all. Each round sends exactly one message
  // each way between every pair of ranks, and MPI matches messages between a pair in the order
  // they were sent, so a piece's messages can only match that piece's receives.
  const int64_t pieces = std::max<int64_t>(1, (call.count + per_piece - 1) / per_piece);
  std::vector<MpiRound> rounds;
  for (int64_t k = 0; k < pieces; ++k) {
    const int64_t first = k * per_piece;
    AllReduceCall piece = call;
    piece.count = std::min(per_piece, call.count - first);
    const size_t offset = static_cast<size_t>(first) * DTypeSize(call.dtype);
    piece.send = static_cast<const char*>(call.send) + offset;
    piece.recv = static_cast<char*>(call.recv) + offset;
    for (MpiRound& round : DirectRounds(piece, scratch)) rounds.push_back(std::move(round));
  }
  return rounds;
}

}  // namespace zero::comm
