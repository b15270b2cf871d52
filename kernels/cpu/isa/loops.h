// The per-instruction-set loops behind the CPU kernels (internal to kernels/cpu).
//
// Each isa/*.cc file is compiled once per instruction set (scalar, avx2, avx512) with the
// matching compiler flags and ZERO_ISA_NS naming its namespace; the launchers in
// kernels/cpu/*.cc pick one at run time. The interface is plain pointers and PODs so that no
// inline library code is instantiated with wide-vector flags and shared across the builds.
#ifndef ZERO_KERNELS_CPU_ISA_LOOPS_H_
#define ZERO_KERNELS_CPU_ISA_LOOPS_H_

#include <cstdint>

#include "kernels/segments.h"

namespace zero::kernels::cpu {

/// Adam/AdamW scalars, computed once on the host.
struct AdamCoeffs {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
  float l2_decay;          ///< added as wd·p to the gradient (Adam); 0 for AdamW
  float decay_factor;      ///< p *= this before the update (AdamW: 1 - lr·wd); 1 for Adam
  float step_size;         ///< lr / (1 - β1^t)
  float inv_bc2_sqrt;      ///< 1 / sqrt(1 - β2^t)
  float grad_scale;
};

/// SGD scalars.
struct SgdCoeffs {
  float lr, momentum, one_minus_dampening, weight_decay, grad_scale;
  bool nesterov, first_step;
};

/// Lion scalars.
struct LionCoeffs {
  float lr, beta1, one_minus_beta1, beta2, one_minus_beta2, decay_factor, grad_scale;
};

/// LAMB update-direction scalars.
struct LambCoeffs {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  float inv_bc1, inv_bc2;  ///< 1 / (1 - β^t), or 1 without bias correction
  float grad_scale;
};

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
