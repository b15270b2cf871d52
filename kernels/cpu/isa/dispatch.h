// Calls the loop of the chosen instruction set (internal to kernels/cpu).
#ifndef ZERO_KERNELS_CPU_ISA_DISPATCH_H_
#define ZERO_KERNELS_CPU_ISA_DISPATCH_H_

#include "kernels/cpu/isa/loops.h"
#include "base/cpu_isa.h"

/// ZERO_ISA_DISPATCH(isa, Loop, args...) calls avx512::Loop, avx2::Loop or scalar::Loop.
/// Builds for other architectures than x86-64 have only the scalar loops.
#if ZERO_HAVE_X86_ISAS
#define ZERO_ISA_DISPATCH(isa, loop, ...)                                     \
  do {                                                                        \
    switch (isa) {                                                            \
      case ::zero::base::CpuIsa::kAvx512:                                     \
        ::zero::kernels::cpu::avx512::loop(__VA_ARGS__);                      \
        break;                                                                \
      case ::zero::base::CpuIsa::kAvx2:                                       \
        ::zero::kernels::cpu::avx2::loop(__VA_ARGS__);                        \
        break;                                                                \
      case ::zero::base::CpuIsa::kScalar:                                     \
        ::zero::kernels::cpu::scalar::loop(__VA_ARGS__);                      \
        break;                                                                \
    }                                                                         \
  } while (0)
#else
#define ZERO_ISA_DISPATCH(isa, loop, ...) ::zero::kernels::cpu::scalar::loop(__VA_ARGS__)
#endif

#endif  // ZERO_KERNELS_CPU_ISA_DISPATCH_H_
