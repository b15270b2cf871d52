// Every tunable ZeroRT reads from the environment, read in this one place.
//
//   ZERO_DEBUG        WARN (default) | INFO | DETAIL   log verbosity
//   ZERO_CPU_ISA      avx512 | avx2 | scalar           cap the CPU kernels' instruction set
//   ZERO_CPU_THREADS  N ≥ 0                            threads per rank for CPU kernels (0 = the
//                                                      rank's share of the cores, see cpu_exec.h)
//   ZERO_MPI_REDUCE_SCATTER  auto | ring | direct | allreduce | native
//                                                      the MPI reduce-scatter algorithm (auto:
//                                                      measured per size when a communicator
//                                                      is created; comm/mpi/mpi_tuning.h)
//   ZERO_MPI_ALL_REDUCE  auto | native | direct         the MPI all-reduce algorithm (the same)
#ifndef ZERO_BASE_ENV_H_
#define ZERO_BASE_ENV_H_

#include <cstdint>
#include <optional>
#include <string>

#include "base/cpu_isa.h"
#include "base/logging.h"
#include "zero/status.h"

namespace zero::base {

/// The environment's tunables, parsed.
struct EnvTunables {
  LogLevel log_level = LogLevel::kWarn;
  std::optional<CpuIsa> cpu_isa_cap;  ///< unset: the best the CPU supports
  int cpu_threads = 0;                ///< 0: the rank's share of the cores
  std::string mpi_reduce_scatter = "auto";  ///< auto, ring, direct, allreduce or native
  std::string mpi_all_reduce = "auto";      ///< auto, native or direct
};

/// Reads and validates the variables above. A malformed value is kInvalidArgument naming the
/// variable and the accepted values; unset variables keep their defaults.
StatusOr<EnvTunables> ReadEnvTunables();

/// The place a launcher that is not MPI's gave this process: torchrun, the deepspeed launcher
/// and accelerate launch set RANK and WORLD_SIZE for each process they start.
struct LauncherPlace {
  std::string rank;  ///< RANK as it is set
  int64_t world = 0;
};

/// RANK and WORLD_SIZE when both are set and WORLD_SIZE is a number; nullopt otherwise.
std::optional<LauncherPlace> ReadLauncherPlace();

}  // namespace zero::base

#endif  // ZERO_BASE_ENV_H_
