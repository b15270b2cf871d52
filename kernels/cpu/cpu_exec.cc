// CPU execution settings from the environment.
#include "kernels/cpu/cpu_exec.h"

#include <algorithm>

namespace zero::kernels {

CpuExec CpuExecFromEnv(const base::EnvTunables& env) {
  CpuExec exec;
  if (env.cpu_isa_cap.has_value()) exec.isa = std::min(exec.isa, *env.cpu_isa_cap);
  exec.threads = env.cpu_threads;
  return exec;
}

}  // namespace zero::kernels
