// Measuring the reduce-scatter algorithms on a communicator's own ranks.
#include "comm/mpi/mpi_tuning.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
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

}  // namespace

ReduceScatterChoice ReduceScatterChoice::Fixed(ReduceScatterAlgorithm algorithm) {
  ReduceScatterChoice choice;
  std::fill(std::begin(choice.algorithm_), std::end(choice.algorithm_), algorithm);
  choice.description_ = absl::StrCat(ReduceScatterAlgorithmName(algorithm), " (forced)");
  return choice;
}

ReduceScatterAlgorithm ReduceScatterChoice::For(int64_t total_bytes) const {
  for (int i = 0; i + 1 < kRanges; ++i) {
    const double boundary = std::sqrt(static_cast<double>(kProbeBytes[i]) * kProbeBytes[i + 1]);
    if (static_cast<double>(total_bytes) < boundary) return algorithm_[i];
  }
  return algorithm_[kRanges - 1];
}

StatusOr<ReduceScatterChoice> MeasureReduceScatter(MPI_Comm comm, int rank, int size) {
  ReduceScatterChoice choice;
  const int64_t largest = ReduceScatterChoice::kProbeBytes[ReduceScatterChoice::kRanges - 1];
  const int64_t largest_count = largest / 4 / size;
  std::vector<float> send(static_cast<size_t>(largest_count * size));
  std::vector<float> recv(static_cast<size_t>(largest_count));
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>((i + rank) % 13);
  std::vector<char> scratch;
  for (int range = 0; range < ReduceScatterChoice::kRanges; ++range) {
    const int64_t count = std::max<int64_t>(1, ReduceScatterChoice::kProbeBytes[range] / 4 / size);
    double best[std::size(kReduceScatterAlgorithms)];
    double best_overall = std::numeric_limits<double>::infinity();
    std::string timings;
    for (size_t a = 0; a < std::size(kReduceScatterAlgorithms); ++a) {
      const ReduceScatterAlgorithm algorithm = kReduceScatterAlgorithms[a];
      ReduceScatterCall call;
      call.send = send.data();
      call.recv = recv.data();
      call.count = count;
      call.comm = comm;
      call.rank = rank;
      call.size = size;
      call.tag = kProbeTag;
      scratch.resize(std::max(scratch.size(), ReduceScatterScratchBytes(algorithm, call)));
      const std::vector<MpiRound> rounds = ReduceScatterRounds(algorithm, call, scratch.data());
      best[a] = std::numeric_limits<double>::infinity();
      // One untimed run first (connections, first touch of the temporaries).
      for (int run = 0; run <= kTimedRuns; ++run) {
        int rc = MPI_Barrier(comm);
        const double start = MPI_Wtime();
        if (rc == MPI_SUCCESS) rc = RunRoundsBlocking(rounds);
        double slowest = 0;
        if (rc == MPI_SUCCESS) rc = MaxOverRanks(MPI_Wtime() - start, comm, &slowest);
        if (rc != MPI_SUCCESS) return MpiError(rc, "measuring the reduce-scatter algorithms");
        if (run == 0) continue;  // first calls pay for set-up: never judged on that
        best[a] = std::min(best[a], slowest);
        if (best[a] > kGiveUpFactor * best_overall) break;
      }
      best_overall = std::min(best_overall, best[a]);
    }
    size_t winner = 0;
    for (size_t a = 1; a < std::size(kReduceScatterAlgorithms); ++a) {
      if (best[a] < best[winner]) winner = a;
    }
    choice.algorithm_[range] = kReduceScatterAlgorithms[winner];
    for (size_t a = 0; a < std::size(kReduceScatterAlgorithms); ++a) {
      absl::StrAppend(&timings, a == 0 ? "" : ", ",
                      ReduceScatterAlgorithmName(kReduceScatterAlgorithms[a]), " ",
                      absl::StrFormat("%.3f ms", best[a] * 1e3));
    }
    absl::StrAppend(&choice.description_, range == 0 ? "" : "; ",
                    Bytes(ReduceScatterChoice::kProbeBytes[range]), ": ",
                    ReduceScatterAlgorithmName(choice.algorithm_[range]), " (", timings, ")");
  }
  return choice;
}

}  // namespace zero::comm
