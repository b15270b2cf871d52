// CPU execution settings from the environment.
#include "kernels/cpu/cpu_exec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zero::kernels {

CpuExec CpuExecFromEnv(const base::EnvTunables& env) {
  CpuExec exec;
  if (env.cpu_isa_cap.has_value()) exec.isa = std::min(exec.isa, *env.cpu_isa_cap);
  exec.threads = env.cpu_threads;
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
