// The per-instruction-set loops behind the CPU kernels (internal to kernels/cpu).
//
// Each isa/*.cc file is compiled once per instruction set (scalar, avx2, avx512) with the
// matching compiler flags and ZERO_ISA_NS naming its namespace; the launchers in
// kernels/cpu/*.cc pick one at run time. The interface is plain pointers and PODs so that no
// inline library code is instantiated with wide-vector flags and shared across the builds.
#ifndef ZERO_KERNELS_CPU_ISA_LOOPS_H_
#define ZERO_KERNELS_CPU_ISA_LOOPS_H_

#include <cstdint>

#include "kernels/coefficients.h"
#include "kernels/segments.h"

namespace zero::kernels::cpu {

/// Elements per work chunk: the unit of threading and of norm partials. Fixed, so results do
/// not depend on the thread count.
inline constexpr int64_t kChunkElems = 16384;

#define ZERO_DECLARE_ISA_LOOPS(ns)                                                            \
  namespace ns {                                                                              \
  void AdamLoop(const AdamCoeffs& c, SegmentTypes types, const Segment* segments,             \
                int64_t count, int threads);                                                  \
  void SgdLoop(const SgdCoeffs& c, SegmentTypes types, const Segment* segments,               \
               int64_t count, int threads);                                                   \
  void LionLoop(const LionCoeffs& c, SegmentTypes types, const Segment* segments,             \
                int64_t count, int threads);                                                  \
  void LambUpdateLoop(const LambCoeffs& c, SegmentTypes types, const Segment* segments,       \
                      float* const* updates, int64_t count, int threads);                     \
  void LambApplyLoop(float lr, const float* trust_ratios, DType param_type,                   \
                     const Segment* segments, const float* const* updates, int64_t count,     \
                     int threads);                                                            \
  /* Writes one float64 sum of squares per kChunkElems chunk of each span, span-major. */     \
  void SquaresLoop(DType dtype, const ConstSpan* spans, int64_t count, double* partials,      \
                   int threads);                                                              \
  }  // namespace ns

ZERO_DECLARE_ISA_LOOPS(scalar)
ZERO_DECLARE_ISA_LOOPS(avx2)
ZERO_DECLARE_ISA_LOOPS(avx512)

#undef ZERO_DECLARE_ISA_LOOPS

}  // namespace zero::kernels::cpu

#endif  // ZERO_KERNELS_CPU_ISA_LOOPS_H_
