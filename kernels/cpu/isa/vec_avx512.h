// 16-lane fp32 vectors on AVX-512 (F, BW, DQ, VL). Included only by vec.h in the avx512 build.
#ifndef ZERO_KERNELS_CPU_ISA_VEC_AVX512_H_
#define ZERO_KERNELS_CPU_ISA_VEC_AVX512_H_

#include <immintrin.h>

#include <cstdint>

namespace zero::kernels::cpu::ZERO_ISA_NS {
namespace {  // internal linkage: every ISA build has its own copy

struct Vec {
  static constexpr int kLanes = 16;
  __m512 v;
};

inline Vec Set(float x) { return {_mm512_set1_ps(x)}; }
inline Vec LoadF32(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void StoreF32(float* p, Vec x) { _mm512_storeu_ps(p, x.v); }

inline Vec LoadBf16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))};
}

// Round to nearest even on the bit pattern; NaN is quieted instead of rounded.
inline void StoreBf16(uint16_t* p, Vec x) {
  const __m512i bits = _mm512_castps_si512(x.v);
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  const __m512i out = _mm512_mask_blend_epi32(is_nan, rounded, quiet);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(out));
}

inline Vec LoadHalf(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline void StoreHalf(uint16_t* p, Vec x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

inline Vec Add(Vec a, Vec b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vec Sub(Vec a, Vec b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vec Mul(Vec a, Vec b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vec Div(Vec a, Vec b) { return {_mm512_div_ps(a.v, b.v)}; }
inline Vec Sqrt(Vec a) { return {_mm512_sqrt_ps(a.v)}; }
/// a·b + c with one rounding.
inline Vec MulAdd(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
/// +1 where x > 0, -1 where x < 0, 0 elsewhere (zero and NaN).
inline Vec Sign(Vec x) {
  const __m512 zero = _mm512_setzero_ps();
  const __mmask16 pos = _mm512_cmp_ps_mask(x.v, zero, _CMP_GT_OQ);
  const __mmask16 neg = _mm512_cmp_ps_mask(x.v, zero, _CMP_LT_OQ);
  __m512 out = _mm512_mask_mov_ps(zero, pos, _mm512_set1_ps(1.0f));
  return {_mm512_mask_mov_ps(out, neg, _mm512_set1_ps(-1.0f))};
}

/// Float64 sum-of-squares accumulator.
struct SquareSum {
  __m512d lo = _mm512_setzero_pd();
  __m512d hi = _mm512_setzero_pd();
};
inline void AccumulateSquares(SquareSum& acc, Vec x) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x.v));
  const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x.v, 1));
  acc.lo = _mm512_fmadd_pd(lo, lo, acc.lo);
  acc.hi = _mm512_fmadd_pd(hi, hi, acc.hi);
}
/// Sum of all lanes in a fixed order.
inline double Total(const SquareSum& acc) {
  alignas(64) double lanes[16];
  _mm512_store_pd(lanes, acc.lo);
  _mm512_store_pd(lanes + 8, acc.hi);
  double total = 0.0;
  for (double lane : lanes) total += lane;
  return total;
}

}  // namespace
}  // namespace zero::kernels::cpu::ZERO_ISA_NS

#endif  // ZERO_KERNELS_CPU_ISA_VEC_AVX512_H_
