// Progress line, JSON records and the summary table.
#include "report.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zero::tools {
namespace {

std::string Bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", bytes / double(1 << 30));
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.1f MiB", bytes / double(1 << 20));
  return absl::StrFormat("%.1f KiB", bytes / 1024.0);
}

int64_t Total(const RankMemory& m) {
  int64_t total = 0;
  for (int64_t b : m.peak) total += b;
  return total;
}

// JSON numbers must be finite.
std::string Number(double v) { return std::isfinite(v) ? absl::StrFormat("%.10g", v) : "null"; }

std::string MemoryJson(const RankMemory& m) {
  std::string out = absl::StrCat("{\"rank\":", m.rank);
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    absl::StrAppend(&out, ",\"", MemoryCategoryName(static_cast<MemoryCategory>(c)), "\":", m.peak[c]);
  }
  return out + "}";
}

}  // namespace

Report::Report(int steps, bool json)
    : steps_(steps), json_(json), terminal_(isatty(STDERR_FILENO) == 1) {}

void Report::Step(int step, double loss, const StepInfo& info, float lr, const RankMemory& memory) {
  if (!std::isfinite(loss) && !said_diverged_) {  // JSON writes inf and nan alike as null
    said_diverged_ = true;
    std::fprintf(stderr, "zero-train: the loss is %s at step %d: the run diverged (a lower --lr, --clip, or "
                 "--precision fp32 keeps it finite)\n", std::isnan(loss) ? "nan" : "inf", step + 1);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = (step + 1) / seconds;
  if (json_) {
    std::printf("{\"step\":%d,\"loss\":%s,\"lr\":%s,\"grad_norm\":%s,\"loss_scale\":%s,\"skipped\":%s,"
                "\"steps_per_s\":%s}\n",
                step + 1, Number(loss).c_str(), Number(lr).c_str(), Number(info.grad_norm).c_str(),
                Number(info.loss_scale).c_str(), info.skipped ? "true" : "false", Number(rate).c_str());
    std::fflush(stdout);
  }
  const std::string line = absl::StrFormat(
      "step %*d/%d  loss %.6f  lr %.3g  %.1f steps/s  |g| %.4g  scale %g%s  mem %s/rank",
      int(std::to_string(steps_).size()), step + 1, steps_, loss, lr, rate, info.grad_norm, info.loss_scale,
      info.skipped ? " (skipped)" : "",
      Bytes(Total(memory)));
  if (terminal_) {
    std::fprintf(stderr, "\r%s\x1b[K", line.c_str());
    if (step + 1 == steps_) std::fprintf(stderr, "\n");
  } else if (step == 0 || (step + 1) % std::max(1, steps_ / 10) == 0 || step + 1 == steps_) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void Report::Finish(int first, int reached, bool preempted, double final_loss, double checksum,
                    const std::vector<RankMemory>& memory, const std::string& setup) {
  const bool ran = reached > first;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (json_) {
    std::string ranks;
    for (const RankMemory& m : memory) absl::StrAppend(&ranks, ranks.empty() ? "" : ",", MemoryJson(m));
    std::printf(
        "{\"summary\":true,\"final_loss\":%s,\"checksum\":%s,\"steps\":%d,\"of_steps\":%d,\"preempted\":%s,"
        "\"seconds\":%s,\"peak_bytes\":[%s]}\n",
        ran ? Number(final_loss).c_str() : "null", Number(checksum).c_str(), reached, steps_, preempted ? "true" : "false",
        Number(seconds).c_str(), ranks.c_str());
    std::fflush(stdout);
    return;
  }
  const std::string done = reached >= steps_ ? absl::StrCat(reached, " steps")
                                              : absl::StrCat(reached, " of ", steps_, " steps",
                                                             preempted ? " (stopped on a scheduler's signal)" : "");
  const std::string loss = ran ? absl::StrFormat("final loss %.6f after", final_loss) : "no step to run:";
  std::printf("%s\n%s %s in %.1f s; checksum %.10g\n", setup.c_str(), loss.c_str(), done.c_str(), seconds, checksum);
  std::printf("peak bytes per rank: %-6s", "rank");
  for (int c = 0; c < kMemoryCategoryCount; ++c) std::printf(" %13s", MemoryCategoryName(static_cast<MemoryCategory>(c)));
  std::printf(" %13s\n", "total");
  for (const RankMemory& m : memory) {
    std::printf("                     %-6d", m.rank);
    for (int64_t b : m.peak) std::printf(" %13s", Bytes(b).c_str());
    std::printf(" %13s\n", Bytes(Total(m)).c_str());
  }
}

}  // namespace zero::tools
