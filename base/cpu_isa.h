// The x86-64 vector instruction sets the CPU kernels are built for, and run-time detection of
// which one this CPU (and OS) supports. The binary runs on any x86-64; the kernels pick the
// widest supported set at run time.
#ifndef ZERO_BASE_CPU_ISA_H_
#define ZERO_BASE_CPU_ISA_H_

#include <string_view>

#include "zero/status.h"

namespace zero::base {

/// Ordered from narrowest to widest: a cap of kAvx2 allows kScalar and kAvx2.
enum class CpuIsa : int {
  kScalar = 0,  ///< portable C++, no vector extensions assumed
  kAvx2 = 1,    ///< AVX2 + FMA + F16C
  kAvx512 = 2,  ///< AVX-512 F/BW/DQ/VL + F16C
};

/// "scalar", "avx2", "avx512".
const char* CpuIsaName(CpuIsa isa);

/// Parses the names above; anything else is kInvalidArgument.
StatusOr<CpuIsa> ParseCpuIsa(std::string_view name);

/// The widest set this CPU and OS support (checked with CPUID and XGETBV once per process).
CpuIsa DetectCpuIsa();

}  // namespace zero::base

#endif  // ZERO_BASE_CPU_ISA_H_
