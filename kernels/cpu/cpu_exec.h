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

/// The thread team of one rank's CPU kernels when ZERO_CPU_THREADS does not set it.
/// `usable_cores`: the CPUs this process may run on (its affinity mask); `online_cores`: the
/// machine's; `ranks_on_this_host`: the ranks sharing them. A process whose launcher bound it
/// to fewer CPUs than the machine has (mpirun --bind-to core, taskset) uses all of its own;
/// unbound ranks split the machine evenly, at least one thread each. A mask that several ranks
/// share (a container's cpuset, taskset around mpirun, binding to a socket) is taken as one
/// rank's own: set ZERO_CPU_THREADS there. Teams larger than their share of the cores cost
/// several times their speed: OpenMP threads that spin at barriers take the cores the other
/// ranks' threads and progress threads need (measured in bench/RESULTS.md).
int ThreadsPerRank(int usable_cores, int online_cores, int ranks_on_this_host);

/// The best ISA the CPU supports, capped by ZERO_CPU_ISA, with ZERO_CPU_THREADS threads, or
/// when that is 0, ThreadsPerRank of this machine's cores.
CpuExec CpuExecFromEnv(const base::EnvTunables& env, int ranks_on_this_host);

/// The ISA is supported by this CPU and the thread count is not negative.
Status CheckExec(const CpuExec& exec);

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_CPU_CPU_EXEC_H_
