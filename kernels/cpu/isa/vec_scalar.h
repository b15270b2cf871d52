// One-lane "vectors" in portable C++: the fallback for any CPU. Included only by vec.h in the
// scalar build. Conversions are the exact ones of zero/dtype.h.
#ifndef ZERO_KERNELS_CPU_ISA_VEC_SCALAR_H_
#define ZERO_KERNELS_CPU_ISA_VEC_SCALAR_H_

#include <cmath>
#include <cstdint>

#include "zero/dtype.h"

namespace zero::kernels::cpu::ZERO_ISA_NS {
namespace {  // internal linkage: every ISA build has its own copy

struct Vec {
  static constexpr int kLanes = 1;
  float v;
};

inline Vec Set(float x) { return {x}; }
inline Vec LoadF32(const float* p) { return {*p}; }
inline void StoreF32(float* p, Vec x) { *p = x.v; }
inline Vec LoadBf16(const uint16_t* p) { return {Bf16ToFloat(*p)}; }
inline void StoreBf16(uint16_t* p, Vec x) { *p = FloatToBf16(x.v); }
inline Vec LoadHalf(const uint16_t* p) { return {HalfToFloat(*p)}; }
inline void StoreHalf(uint16_t* p, Vec x) { *p = FloatToHalf(x.v); }

inline Vec Add(Vec a, Vec b) { return {a.v + b.v}; }
inline Vec Sub(Vec a, Vec b) { return {a.v - b.v}; }
inline Vec Mul(Vec a, Vec b) { return {a.v * b.v}; }
inline Vec Div(Vec a, Vec b) { return {a.v / b.v}; }
inline Vec Sqrt(Vec a) { return {std::sqrt(a.v)}; }
/// a·b + c (two roundings here: a portable CPU may lack FMA, and libm's fma is slow).
inline Vec MulAdd(Vec a, Vec b, Vec c) { return {a.v * b.v + c.v}; }
/// +1 where x > 0, -1 where x < 0, 0 elsewhere (zero and NaN).
inline Vec Sign(Vec x) { return {x.v > 0.0f ? 1.0f : (x.v < 0.0f ? -1.0f : 0.0f)}; }

/// Float64 sum-of-squares accumulator.
struct SquareSum {
  double sum = 0.0;
};
inline void AccumulateSquares(SquareSum& acc, Vec x) {
  const double d = x.v;
  acc.sum += d * d;
}
inline double Total(const SquareSum& acc) { return acc.sum; }

}  // namespace
}  // namespace zero::kernels::cpu::ZERO_ISA_NS

#endif  // ZERO_KERNELS_CPU_ISA_VEC_SCALAR_H_
