// Parsing of ZeroRT's environment variables.
#include "base/env.h"

#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace zero::base {
namespace {

const char* Get(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

}  // namespace

StatusOr<EnvTunables> ReadEnvTunables() {
  EnvTunables env;
  if (const char* debug = Get("ZERO_DEBUG")) {
    const std::string level = absl::AsciiStrToUpper(debug);
    if (level == "WARN") {
      env.log_level = LogLevel::kWarn;
    } else if (level == "INFO") {
      env.log_level = LogLevel::kInfo;
    } else if (level == "DETAIL") {
      env.log_level = LogLevel::kDetail;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("ZERO_DEBUG=", debug, " is not one of WARN, INFO, DETAIL"));
    }
  }
  if (const char* isa = Get("ZERO_CPU_ISA")) {
    auto parsed = ParseCpuIsa(isa);
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("ZERO_CPU_ISA: ",
                                                                     parsed.status().message()));
    env.cpu_isa_cap = *parsed;
  }
  if (const char* threads = Get("ZERO_CPU_THREADS")) {
    if (!absl::SimpleAtoi(threads, &env.cpu_threads) || env.cpu_threads < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ZERO_CPU_THREADS=", threads, " is not a non-negative integer"));
    }
  }
  if (const char* algorithm = Get("ZERO_MPI_REDUCE_SCATTER")) {
    env.mpi_reduce_scatter = absl::AsciiStrToLower(algorithm);
    const std::string& a = env.mpi_reduce_scatter;
    if (a != "auto" && a != "ring" && a != "direct" && a != "allreduce" && a != "native") {
      return absl::InvalidArgumentError(absl::StrCat(
          "ZERO_MPI_REDUCE_SCATTER=", algorithm, " is not one of auto, ring, direct, allreduce, native"));
    }
  }
  if (const char* algorithm = Get("ZERO_MPI_ALL_REDUCE")) {
    env.mpi_all_reduce = absl::AsciiStrToLower(algorithm);
    const std::string& a = env.mpi_all_reduce;
    if (a != "auto" && a != "native" && a != "direct") {
      return absl::InvalidArgumentError(
          absl::StrCat("ZERO_MPI_ALL_REDUCE=", algorithm, " is not one of auto, native, direct"));
    }
  }
  return env;
}

std::optional<LauncherPlace> ReadLauncherPlace() {
  const char* rank = Get("RANK");
  const char* world = Get("WORLD_SIZE");
  LauncherPlace place;
  if (rank == nullptr || world == nullptr || !absl::SimpleAtoi(world, &place.world)) return std::nullopt;
  place.rank = rank;
  return place;
}

}  // namespace zero::base
