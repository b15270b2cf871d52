// Selects the vector implementation for the instruction set this translation unit is being
// compiled for (the build passes -mavx512* or -mavx2 and ZERO_ISA_NS).
//
// Every implementation offers the same operations on `Vec` (kLanes fp32 lanes): Set, LoadF32,
// StoreF32, LoadBf16, StoreBf16, LoadHalf, StoreHalf, Add, Sub, Mul, Div, Sqrt, MulAdd, Sign,
// and a float64 `SquareSum` with AccumulateSquares and Total.
#ifndef ZERO_KERNELS_CPU_ISA_VEC_H_
#define ZERO_KERNELS_CPU_ISA_VEC_H_

#ifndef ZERO_ISA_NS
#error "ZERO_ISA_NS must name the instruction-set namespace (scalar, avx2, avx512)"
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#include "kernels/cpu/isa/vec_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/cpu/isa/vec_avx2.h"
#else
#include "kernels/cpu/isa/vec_scalar.h"
#endif

#endif  // ZERO_KERNELS_CPU_ISA_VEC_H_
