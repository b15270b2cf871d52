// CPU execution settings from the environment and the machine.
#include "kernels/cpu/cpu_exec.h"

#include <algorithm>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

#include "absl/strings/str_cat.h"

namespace zero::kernels {
namespace {

// The CPUs this process may run on: its affinity mask where the OS has one.
int UsableCores() {
#if defined(__linux__)
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) return std::max(1, CPU_COUNT(&mask));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

int ThreadsPerRank(int usable_cores, int online_cores, int ranks_on_this_host) {
  usable_cores = std::max(1, usable_cores);
  if (usable_cores < online_cores) return usable_cores;  // the launcher gave this rank its share
  return std::max(1, usable_cores / std::max(1, ranks_on_this_host));
}

CpuExec CpuExecFromEnv(const base::EnvTunables& env, int ranks_on_this_host) {
  CpuExec exec;
  if (env.cpu_isa_cap.has_value()) exec.isa = std::min(exec.isa, *env.cpu_isa_cap);
  exec.threads = env.cpu_threads > 0
                     ? env.cpu_threads
                     : ThreadsPerRank(UsableCores(),
                                      static_cast<int>(std::thread::hardware_concurrency()),
                                      ranks_on_this_host);
  return exec;
}

Status CheckExec(const CpuExec& exec) {
  if (exec.isa > base::DetectCpuIsa()) {
    return absl::InvalidArgumentError(absl::StrCat("CPU ISA ", base::CpuIsaName(exec.isa),
                                                   " requested, but this CPU supports at most ",
                                                   base::CpuIsaName(base::DetectCpuIsa())));
  }
  if (exec.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("thread count ", exec.threads, " is negative"));
  }
  return absl::OkStatus();
}

}  // namespace zero::kernels
