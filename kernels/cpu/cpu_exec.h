// How a CPU kernel launch runs: which instruction set and how many threads.
#ifndef ZERO_KERNELS_CPU_CPU_EXEC_H_
#define ZERO_KERNELS_CPU_CPU_EXEC_H_

#include "base/cpu_isa.h"
#include "base/env.h"
#include "zero/status.h"

namespace zero::kernels {

/// Execution settings of a CPU kernel launch (the CPU's analogue of a stream).
struct CpuExec {
  base::CpuIsa isa = base::DetectCpuIsa();  ///< must not exceed what the CPU supports
  int threads = 0;                          ///< 0: all cores (OpenMP's default team)
};

/// The best ISA the CPU supports, capped by ZERO_CPU_ISA, with ZERO_CPU_THREADS threads.
CpuExec CpuExecFromEnv(const base::EnvTunables& env);

/// The ISA is supported by this CPU and the thread count is not negative.
Status CheckExec(const CpuExec& exec);

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_CPU_CPU_EXEC_H_
