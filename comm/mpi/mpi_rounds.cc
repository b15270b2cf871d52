// Reduce-scatter algorithms as rounds of non-blocking MPI calls.
#include "comm/mpi/mpi_rounds.h"

#include <climits>
#include <cstring>

#include "comm/host_reduce.h"

namespace zero::comm {
namespace {

const char* ChunkOf(const void* buffer, int index, size_t chunk_bytes) {
  return static_cast<const char*>(buffer) + static_cast<size_t>(index) * chunk_bytes;
}

// MPI_Ireduce_scatter_block. MPI puts an in-place result at the start of the buffer, ours
// belongs at the rank's chunk: then MPI writes into scratch and a last round copies it over.
bool InPlace(const ReduceScatterCall& c, size_t bytes) { return ChunkOf(c.send, c.rank, bytes) == c.recv; }

std::vector<MpiRound> NativeRounds(const ReduceScatterCall& c, char* scratch) {
  const size_t bytes = static_cast<size_t>(c.count) * DTypeSize(c.dtype);
  const bool in_place = InPlace(c, bytes);
  void* target = in_place ? scratch : c.recv;
  std::vector<MpiRound> rounds;
  rounds.push_back([c, target](std::vector<MPI_Request>* requests) {
    requests->push_back(MPI_REQUEST_NULL);
    return MPI_Ireduce_scatter_block(c.send, target, static_cast<int>(c.count), c.mpi_type,
                                     c.mpi_op, c.comm, &requests->back());
  });
  if (in_place) {
    rounds.push_back([c, target, bytes](std::vector<MPI_Request>*) {
      std::memcpy(c.recv, target, bytes);
      return MPI_SUCCESS;
    });
  }
  return rounds;
}

// MPI_Iallreduce of the whole buffer into scratch, then this rank's chunk copied out. Twice
// the bytes of a reduce-scatter on the wire, but OpenMPI's all-reduce algorithms are far
// better tuned than its reduce-scatter (bench/RESULTS.md).
std::vector<MpiRound> AllReduceKeepShardRounds(const ReduceScatterCall& c, char* scratch) {
  const size_t bytes = static_cast<size_t>(c.count) * DTypeSize(c.dtype);
  char* full = scratch;
  std::vector<MpiRound> rounds;
  rounds.push_back([c, full](std::vector<MPI_Request>* requests) {
    requests->push_back(MPI_REQUEST_NULL);
    return MPI_Iallreduce(c.send, full, static_cast<int>(c.count * c.size), c.mpi_type, c.mpi_op,
                          c.comm, &requests->back());
  });
  rounds.push_back([c, full, bytes](std::vector<MPI_Request>*) {
    std::memcpy(c.recv, ChunkOf(full, c.rank, bytes), bytes);
    return MPI_SUCCESS;
  });
  return rounds;
}

// The ring (as NCCL's and Horovod's): in round s, rank r sends the partial sum of chunk
// (r − 1 − s) mod n to its right neighbour and receives the partial sum of chunk (r − 2 − s)
// mod n from its left, then adds its own input chunk to it. After n − 1 rounds the chunk it
// received last is chunk r, summed over all ranks. Each rank sends and receives (n − 1)/n of
// the buffer, the minimum for a reduce-scatter. Two chunk-sized temporaries alternate: one is
// sent while the other receives.
//
// The reduction order is fixed by the ring (chunk c's sum starts at rank c + 1 and goes
// round), so results are the same on every run; in fp32 they may differ from MPI's own
// order in the last bit.
std::vector<MpiRound> RingRounds(const ReduceScatterCall& c, char* scratch) {
  const size_t bytes = static_cast<size_t>(c.count) * DTypeSize(c.dtype);
  const int n = c.size;
  std::vector<MpiRound> rounds;
  if (n == 1) {
    rounds.push_back([c, bytes](std::vector<MPI_Request>*) {
      if (c.recv != c.send) std::memmove(c.recv, c.send, bytes);
      return MPI_SUCCESS;
    });
    return rounds;
  }
  char* temporaries[2] = {scratch, scratch + bytes};
  const int right = (c.rank + 1) % n;
  const int left = (c.rank + n - 1) % n;
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  for (int s = 0; s < n - 1; ++s) {
    char* receive_into = temporaries[s % 2];
    const void* send_from = s == 0 ? ChunkOf(c.send, mod(c.rank - 1), bytes)
                                   : temporaries[(s - 1) % 2];
    const int previous_chunk = mod(c.rank - 1 - s);  // what round s − 1 received
    char* previous = s == 0 ? nullptr : temporaries[(s - 1) % 2];
    rounds.push_back([c, s, receive_into, send_from, previous, previous_chunk, bytes, left,
                      right](std::vector<MPI_Request>* requests) {
      if (s > 0) {  // finish round s − 1: add this rank's own chunk to the partial sum
        const void* inputs[2] = {previous, ChunkOf(c.send, previous_chunk, bytes)};
        ReduceInto(previous, inputs, 2, c.count, c.dtype, c.op);
      }
      requests->push_back(MPI_REQUEST_NULL);
      int rc = MPI_Irecv(receive_into, static_cast<int>(c.count), c.mpi_type, left, c.tag,
                         c.comm, &requests->back());
      if (rc != MPI_SUCCESS) return rc;
      requests->push_back(MPI_REQUEST_NULL);
      return MPI_Isend(send_from, static_cast<int>(c.count), c.mpi_type, right, c.tag,
                       c.comm, &requests->back());
    });
  }
  char* last = temporaries[(n - 2) % 2];  // chunk r, summed over every rank but this one
  rounds.push_back([c, last, bytes](std::vector<MPI_Request>*) {
    const void* inputs[2] = {last, ChunkOf(c.send, c.rank, bytes)};
    ReduceInto(c.recv, inputs, 2, c.count, c.dtype, c.op);
    return MPI_SUCCESS;
  });
  return rounds;
}

// Direct exchange (MPICH's pairwise reduce-scatter, all pairs at once): each rank sends
// chunk p of its input to rank p and receives chunk r from every peer, in one round, then
// reduces the n chunks in rank order (fp32 accumulation, one rounding). The same bytes on the
// wire as the ring, but one round instead of n − 1: fewer hand-offs between the ranks'
// threads, which is what costs most when ranks outnumber cores. n − 1 chunk-sized
// temporaries.
std::vector<MpiRound> DirectRounds(const ReduceScatterCall& c, char* scratch) {
  const size_t bytes = static_cast<size_t>(c.count) * DTypeSize(c.dtype);
  const int n = c.size;
  // Slot of peer p's contribution in `scratch`: peers in rank order, this rank skipped.
  auto slot = [c, scratch, bytes](int peer) {
    return scratch + static_cast<size_t>(peer < c.rank ? peer : peer - 1) * bytes;
  };
  std::vector<MpiRound> rounds;
  rounds.push_back([c, n, slot, bytes](std::vector<MPI_Request>* requests) {
    for (int peer = 0; peer < n; ++peer) {
      if (peer == c.rank) continue;
      requests->push_back(MPI_REQUEST_NULL);
      const int rc = MPI_Irecv(slot(peer), static_cast<int>(c.count), c.mpi_type, peer, c.tag,
                               c.comm, &requests->back());
      if (rc != MPI_SUCCESS) return rc;
    }
    for (int step = 1; step < n; ++step) {  // rank r + 1 first: no peer is everyone's first
      const int peer = (c.rank + step) % n;
      requests->push_back(MPI_REQUEST_NULL);
      const int rc = MPI_Isend(ChunkOf(c.send, peer, bytes), static_cast<int>(c.count),
                               c.mpi_type, peer, c.tag, c.comm, &requests->back());
      if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
  });
  rounds.push_back([c, n, slot, bytes](std::vector<MPI_Request>*) {
    std::vector<const void*> inputs(static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) inputs[p] = p == c.rank ? ChunkOf(c.send, c.rank, bytes) : slot(p);
    ReduceInto(c.recv, inputs.data(), n, c.count, c.dtype, c.op);  // in place is fine: block-wise
    return MPI_SUCCESS;
  });
  return rounds;
}

}  // namespace

const char* AlgorithmName(ReduceScatterAlgorithm algorithm) {
  switch (algorithm) {
    case ReduceScatterAlgorithm::kNative: return "native";
    case ReduceScatterAlgorithm::kAllReduce: return "allreduce";
    case ReduceScatterAlgorithm::kRing: return "ring";
    case ReduceScatterAlgorithm::kDirect: return "direct";
  }
  return "?";
}

ReduceScatterAlgorithm EffectiveAlgorithm(ReduceScatterAlgorithm algorithm,
                                          const ReduceScatterCall& call) {
  if (algorithm == ReduceScatterAlgorithm::kAllReduce && call.count * call.size > INT_MAX) {
    return ReduceScatterAlgorithm::kRing;
  }
  return algorithm;
}

size_t ReduceScatterScratchBytes(ReduceScatterAlgorithm algorithm, const ReduceScatterCall& call) {
  const size_t bytes = static_cast<size_t>(call.count) * DTypeSize(call.dtype);
  switch (EffectiveAlgorithm(algorithm, call)) {
    case ReduceScatterAlgorithm::kNative: return InPlace(call, bytes) ? bytes : 0;
    case ReduceScatterAlgorithm::kAllReduce: return bytes * call.size;
    case ReduceScatterAlgorithm::kDirect: return bytes * (call.size - 1);
    case ReduceScatterAlgorithm::kRing: break;
  }
  return call.size > 1 ? 2 * bytes : 0;
}

std::vector<MpiRound> ReduceScatterRounds(ReduceScatterAlgorithm algorithm,
                                          const ReduceScatterCall& call, char* scratch) {
  switch (EffectiveAlgorithm(algorithm, call)) {
    case ReduceScatterAlgorithm::kNative: return NativeRounds(call, scratch);
    case ReduceScatterAlgorithm::kAllReduce: return AllReduceKeepShardRounds(call, scratch);
    case ReduceScatterAlgorithm::kDirect: return DirectRounds(call, scratch);
    case ReduceScatterAlgorithm::kRing: break;
  }
  return RingRounds(call, scratch);
}

int RunRoundsBlocking(const std::vector<MpiRound>& rounds) {
  std::vector<MPI_Request> requests;
  for (const MpiRound& round : rounds) {
    requests.clear();
    int rc = round(&requests);
    if (rc == MPI_SUCCESS && !requests.empty()) {
      rc = MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    }
    if (rc != MPI_SUCCESS) return rc;
  }
  return MPI_SUCCESS;
}

}  // namespace zero::comm
