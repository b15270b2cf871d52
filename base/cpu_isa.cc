// CPU instruction-set detection and names.
#include "base/cpu_isa.h"

#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include "absl/strings/str_cat.h"

namespace zero::base {

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "invalid";
}

StatusOr<CpuIsa> ParseCpuIsa(std::string_view name) {
  if (name == "scalar") return CpuIsa::kScalar;
  if (name == "avx2") return CpuIsa::kAvx2;
  if (name == "avx512") return CpuIsa::kAvx512;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown CPU ISA \"", std::string(name), "\"; expected avx512, avx2 or scalar"));
}

#if defined(__x86_64__) && defined(__GNUC__)
namespace {

// F16C (CPUID leaf 1, ECX bit 29), read directly: clang 14's __builtin_cpu_supports does not
// know "f16c". Every CPU with AVX2 has it in practice; the check keeps the kernels honest.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
}

}  // namespace
#endif

namespace {

CpuIsa ReadCpuIsa() {
#if defined(__x86_64__) && defined(__GNUC__)
  // libgcc's feature bits include the XGETBV check that the OS saves the wide registers.
  __builtin_cpu_init();
  const bool f16c = HasF16c();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && f16c) {
    return CpuIsa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) {
    return CpuIsa::kAvx2;
  }
#endif
  return CpuIsa::kScalar;
}

}  // namespace

CpuIsa DetectCpuIsa() {
  // Read once: CPUID is slow (a trap to the hypervisor on virtual machines), and every CPU
  // kernel launch checks its instruction set against this.
  static const CpuIsa isa = ReadCpuIsa();
  return isa;
}

}  // namespace zero::base
