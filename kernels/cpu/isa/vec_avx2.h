// 8-lane fp32 vectors on AVX2 + FMA + F16C. Included only by vec.h in the avx2 build.
#ifndef ZERO_KERNELS_CPU_ISA_VEC_AVX2_H_
#define ZERO_KERNELS_CPU_ISA_VEC_AVX2_H_

#include <immintrin.h>

#include <cstdint>

namespace zero::kernels::cpu::ZERO_ISA_NS {
namespace {  // internal linkage: every ISA build has its own copy

struct Vec {
  static constexpr int kLanes = 8;
  __m256 v;
};

inline Vec Set(float x) { return {_mm256_set1_ps(x)}; }
inline Vec LoadF32(const float* p) { return {_mm256_loadu_ps(p)}; }
inline void StoreF32(float* p, Vec x) { _mm256_storeu_ps(p, x.v); }

inline Vec LoadBf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))};
}

// Round to nearest even on the bit pattern; NaN is quieted instead of rounded.
inline void StoreBf16(uint16_t* p, Vec x) {
  const __m256i bits = _mm256_castps_si256(x.v);
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i out = _mm256_blendv_epi8(rounded, quiet, is_nan);
  // Narrow 8 × u32 (all ≤ 0xffff) to 8 × u16: pack within 128-bit lanes, then gather qwords.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(out, out), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

inline Vec LoadHalf(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline void StoreHalf(uint16_t* p, Vec x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

inline Vec Add(Vec a, Vec b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vec Sub(Vec a, Vec b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vec Mul(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vec Div(Vec a, Vec b) { return {_mm256_div_ps(a.v, b.v)}; }
inline Vec Sqrt(Vec a) { return {_mm256_sqrt_ps(a.v)}; }
/// a·b + c with one rounding.
inline Vec MulAdd(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
/// +1 where x > 0, -1 where x < 0, 0 elsewhere (zero and NaN).
inline Vec Sign(Vec x) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 pos = _mm256_and_ps(_mm256_cmp_ps(x.v, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f));
  const __m256 neg = _mm256_and_ps(_mm256_cmp_ps(x.v, zero, _CMP_LT_OQ), _mm256_set1_ps(1.0f));
  return {_mm256_sub_ps(pos, neg)};
}

/// Float64 sum-of-squares accumulator.
struct SquareSum {
  __m256d lo = _mm256_setzero_pd();
  __m256d hi = _mm256_setzero_pd();
};
inline void AccumulateSquares(SquareSum& acc, Vec x) {
  const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x.v));
  const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x.v, 1));
  acc.lo = _mm256_fmadd_pd(lo, lo, acc.lo);
  acc.hi = _mm256_fmadd_pd(hi, hi, acc.hi);
}
/// Sum of all lanes in a fixed order.
inline double Total(const SquareSum& acc) {
  alignas(32) double lanes[8];
  _mm256_store_pd(lanes, acc.lo);
  _mm256_store_pd(lanes + 4, acc.hi);
  double total = 0.0;
  for (double lane : lanes) total += lane;
  return total;
}

}  // namespace
}  // namespace zero::kernels::cpu::ZERO_ISA_NS

#endif  // ZERO_KERNELS_CPU_ISA_VEC_AVX2_H_
