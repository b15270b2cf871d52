// zero-train's output: a live progress line on a terminal (plain lines otherwise), one JSON
// object per step with --json, and the final summary.
#ifndef ZERO_TOOLS_ZERO_TRAIN_REPORT_H_
#define ZERO_TOOLS_ZERO_TRAIN_REPORT_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "zero/engine.h"

namespace zero::tools {

/// Peak bytes per category of one rank.
struct RankMemory {
  int rank = 0;
  int64_t peak[kMemoryCategoryCount] = {};
};

class Report {
 public:
  Report(int steps, bool json);

  /// After each step (rank 0 only).
  void Step(int step, double loss, const StepInfo& info, float lr, const RankMemory& memory);
  /// At the end (rank 0 only): `reached` steps done of the run's --steps, from step `first` (a
  /// resumed run's; when they are equal no step ran and there is no final loss), `preempted`: it
  /// stopped there on a scheduler's signal.
  void Finish(int first, int reached, bool preempted, double final_loss, double checksum,
              const std::vector<RankMemory>& memory, const std::string& setup);

 private:
  const int steps_;
  const bool json_, terminal_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  bool said_diverged_ = false;  // a non-finite loss is said once, on stderr
};

}  // namespace zero::tools

#endif  // ZERO_TOOLS_ZERO_TRAIN_REPORT_H_
