// Library version and build contents.
#include "zero/version.h"

#include <string>

#include "base/cpu_isa.h"

namespace zero {

const char* Version() { return ZERO_VERSION_STRING; }

const char* BuildSummary() {
  static const std::string summary =
      std::string("ZeroRT ") + ZERO_VERSION_STRING + " (cuda: " + (ZERO_HAVE_CUDA ? "yes" : "no") +
      ", mpi: " + (ZERO_HAVE_MPI ? "yes" : "no") +
      ", cpu isa: " + base::CpuIsaName(base::DetectCpuIsa()) + ")";
  return summary.c_str();
}

}  // namespace zero
