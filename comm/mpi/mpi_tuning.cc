// Measuring the reduce-scatter and all-reduce algorithms on a communicator's own ranks.
#include "comm/mpi/mpi_tuning.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/env.h"
#include "base/logging.h"
#include "base/status_converters.h"

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

// One collective's algorithm per size: forced by the environment variable `variable`
// (value `setting`), or measured on `comm` (collective), and logged at INFO. `single` serves
// a communicator of one rank, which has nothing to measure.
template <typename Algorithm, size_t N>
StatusOr<AlgorithmChoice<Algorithm>> ChooseAlgorithm(
    MPI_Comm comm, int rank, int size, const base::EnvTunables& env, const char* variable,
    const std::string& setting, const Algorithm (&candidates)[N], const char* collective,
    Algorithm single, StatusOr<AlgorithmChoice<Algorithm>> (*measure)(MPI_Comm, int, int)) {
  Algorithm forced = single;
  bool is_forced = false;
  for (Algorithm candidate : candidates) {
    if (setting == AlgorithmName(candidate)) {
      forced = candidate;
      is_forced = true;
    }
  }
  // Every rank must take the same path (the probe is collective; algorithms must match).
  const int mine = is_forced ? static_cast<int>(forced) : -1;
  int range[2] = {mine, -mine};
  ZERO_MPI_RETURN_IF_ERROR(MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_INT, MPI_MAX, comm));
  if (range[0] != -range[1]) {
    return absl::InvalidArgumentError(absl::StrCat(
        variable, " differs across ranks (rank ", rank, " has \"", setting,
        "\"): set the same value, or none, on every rank"));
  }
  StatusOr<AlgorithmChoice<Algorithm>> choice = AlgorithmChoice<Algorithm>::Fixed(single);
  if (is_forced) {
    choice = AlgorithmChoice<Algorithm>::Fixed(forced);
  } else if (size > 1) {
    choice = measure(comm, rank, size);
  }
  if (choice.ok()) {
    const base::Logger logger(env.log_level, rank);
    ZERO_LOG(logger, kInfo) << "MPI " << collective << " over " << size << " ranks: "
                            << choice->description();
  }
  return choice;
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

Status ChooseAlgorithms(MPI_Comm comm, int rank, int size, ReduceScatterChoice* reduce_scatter,
                        AllReduceChoice* all_reduce) {
  ZERO_ASSIGN_OR_RETURN(const base::EnvTunables env, base::ReadEnvTunables());
  ZERO_ASSIGN_OR_RETURN(*reduce_scatter,
                        ChooseAlgorithm(comm, rank, size, env, "ZERO_MPI_REDUCE_SCATTER",
                                        env.mpi_reduce_scatter, kReduceScatterAlgorithms, "reduce-scatter",
                                        ReduceScatterAlgorithm::kRing, &MeasureReduceScatter));
  ZERO_ASSIGN_OR_RETURN(*all_reduce,
                        ChooseAlgorithm(comm, rank, size, env, "ZERO_MPI_ALL_REDUCE",
                                        env.mpi_all_reduce, kAllReduceAlgorithms, "all-reduce",
                                        AllReduceAlgorithm::kNative,
                                        &MeasureAllReduce));
  return absl::OkStatus();
}


}  // namespace zero::comm
