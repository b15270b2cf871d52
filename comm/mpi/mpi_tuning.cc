// Measuring the reduce-scatter and all-reduce algorithms on a communicator's own ranks.
#include "comm/mpi/mpi_tuning.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"

namespace zero::comm {
namespace {

constexpr int kTimedRuns = 3;
constexpr double kGiveUpFactor = 2.0;  // slower than this × the best so far: timed once only
constexpr int kProbeTag = 32000;       // below MPI_TAG_UB's guaranteed 32767; before any traffic

// The slowest rank's value, on every rank.
int MaxOverRanks(double mine, MPI_Comm comm, double* slowest) {
  return MPI_Allreduce(&mine, slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
}

std::string Bytes(int64_t bytes) {
  return bytes >= (int64_t{1} << 20) ? absl::StrCat(bytes >> 20, " MiB")
                                     : absl::StrCat(bytes >> 10, " KiB");
}

Status MpiError(int rc, const char* doing) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  return absl::InternalError(absl::StrCat("MPI error while ", doing, ": ", text));
}

// Times each of `algorithms` at every probe size and keeps the fastest per range.
// `rounds(algorithm, probe_bytes, scratch)` builds the rounds of one fp32 sum on buffers of
// that many bytes (the builder owns the buffers; `scratch` grows as needed).
template <typename Algorithm, size_t N>
StatusOr<AlgorithmChoice<Algorithm>> Measure(
    MPI_Comm comm, const Algorithm (&algorithms)[N],
    const std::function<std::vector<MpiRound>(Algorithm, int64_t, std::vector<char>*)>& rounds) {
  std::array<Algorithm, kProbeRanges> chosen = {};
  std::string description;
  std::vector<char> scratch;
  for (int range = 0; range < kProbeRanges; ++range) {
    double best[N];
    double best_overall = std::numeric_limits<double>::infinity();
    for (size_t a = 0; a < N; ++a) {
      const std::vector<MpiRound> probe = rounds(algorithms[a], kProbeBytes[range], &scratch);
      best[a] = std::numeric_limits<double>::infinity();
      // One untimed run first (connections, first touch of the temporaries).
      for (int run = 0; run <= kTimedRuns; ++run) {
        int rc = MPI_Barrier(comm);
        const double start = MPI_Wtime();
        if (rc == MPI_SUCCESS) rc = RunRoundsBlocking(probe);
        double slowest = 0;
        if (rc == MPI_SUCCESS) rc = MaxOverRanks(MPI_Wtime() - start, comm, &slowest);
        if (rc != MPI_SUCCESS) return MpiError(rc, "measuring the collective algorithms");
        if (run == 0) continue;  // first calls pay for set-up: never judged on that
        best[a] = std::min(best[a], slowest);
        if (best[a] > kGiveUpFactor * best_overall) break;
      }
      best_overall = std::min(best_overall, best[a]);
    }
    const size_t winner = static_cast<size_t>(std::min_element(best, best + N) - best);
    chosen[range] = algorithms[winner];
    std::string timings;
    for (size_t a = 0; a < N; ++a) {
      absl::StrAppend(&timings, a == 0 ? "" : ", ", AlgorithmName(algorithms[a]), " ",
                      absl::StrFormat("%.3f ms", best[a] * 1e3));
    }
    absl::StrAppend(&description, range == 0 ? "" : "; ", Bytes(kProbeBytes[range]), ": ",
                    AlgorithmName(chosen[range]), " (", timings, ")");
  }
  return AlgorithmChoice<Algorithm>(chosen, std::move(description));
}

// The probe's buffers: the largest size's, filled with small integers (exact fp32 sums).
struct ProbeBuffers {
  std::vector<float> send, recv;
  ProbeBuffers(int64_t elements, int rank) : send(static_cast<size_t>(elements)), recv(send.size()) {
    for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>((i + rank) % 13);
  }
};

ReduceScatterCall ProbeCall(MPI_Comm comm, int rank, int size, ProbeBuffers& buffers, int64_t count) {
  ReduceScatterCall call;
  call.send = buffers.send.data();
  call.recv = buffers.recv.data();
  call.count = count;
  call.comm = comm;
  call.rank = rank;
  call.size = size;
  call.tag = kProbeTag;
  return call;
}

}  // namespace

int ProbeRange(int64_t total_bytes) {
  for (int i = 0; i + 1 < kProbeRanges; ++i) {
    const double boundary = std::sqrt(static_cast<double>(kProbeBytes[i]) * kProbeBytes[i + 1]);
    if (static_cast<double>(total_bytes) < boundary) return i;
  }
  return kProbeRanges - 1;
}

StatusOr<ReduceScatterChoice> MeasureReduceScatter(MPI_Comm comm, int rank, int size) {
  ProbeBuffers buffers(kProbeBytes[kProbeRanges - 1] / 4 / size * size, rank);
  return Measure<ReduceScatterAlgorithm>(
      comm, kReduceScatterAlgorithms,
      [&](ReduceScatterAlgorithm algorithm, int64_t bytes, std::vector<char>* scratch) {
        const ReduceScatterCall call =
            ProbeCall(comm, rank, size, buffers, std::max<int64_t>(1, bytes / 4 / size));
        scratch->resize(std::max(scratch->size(), ReduceScatterScratchBytes(algorithm, call)));
        return ReduceScatterRounds(algorithm, call, scratch->data());
      });
}

StatusOr<AllReduceChoice> MeasureAllReduce(MPI_Comm comm, int rank, int size) {
  ProbeBuffers buffers(kProbeBytes[kProbeRanges - 1] / 4, rank);
  return Measure<AllReduceAlgorithm>(
      comm, kAllReduceAlgorithms,
      [&](AllReduceAlgorithm algorithm, int64_t bytes, std::vector<char>* scratch) {
        const AllReduceCall call = ProbeCall(comm, rank, size, buffers, std::max<int64_t>(1, bytes / 4));
        scratch->resize(std::max(scratch->size(), AllReduceScratchBytes(algorithm, call, bytes)));
        return AllReduceRounds(algorithm, call, bytes, scratch->data());
      });
}

}  // namespace zero::comm
