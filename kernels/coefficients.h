// The scalars of each optimizer step, computed once on the host from the hyperparameters and
// shared by the CPU loops and the CUDA kernels, so both do the same arithmetic.
#ifndef ZERO_KERNELS_COEFFICIENTS_H_
#define ZERO_KERNELS_COEFFICIENTS_H_

#include <cmath>
#include <cstdint>

#include "kernels/segments.h"

namespace zero::kernels {

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

/// 1 - β^t in double, then rounded once (PyTorch computes it in double on the host as well).
inline double BiasCorrection(float beta, int64_t step) {
  return 1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step));
}

inline AdamCoeffs MakeAdamCoeffs(const AdamHyper& h) {
  AdamCoeffs c;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.one_minus_beta1 = 1.0f - h.beta1;
  c.one_minus_beta2 = 1.0f - h.beta2;
  c.eps = h.eps;
  c.l2_decay = h.decoupled_weight_decay ? 0.0f : h.weight_decay;
  c.decay_factor = h.decoupled_weight_decay ? 1.0f - h.lr * h.weight_decay : 1.0f;
  c.step_size = static_cast<float>(h.lr / BiasCorrection(h.beta1, h.step));
  c.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(BiasCorrection(h.beta2, h.step)));
  c.grad_scale = h.common.grad_scale;
  return c;
}

inline SgdCoeffs MakeSgdCoeffs(const SgdHyper& h) {
  return {h.lr, h.momentum, 1.0f - h.dampening, h.weight_decay, h.common.grad_scale, h.nesterov, h.step == 1};
}

inline LionCoeffs MakeLionCoeffs(const LionHyper& h) {
  return {h.lr, h.beta1, 1.0f - h.beta1, h.beta2, 1.0f - h.beta2, 1.0f - h.lr * h.weight_decay, h.common.grad_scale};
}

inline LambCoeffs MakeLambCoeffs(const LambHyper& h) {
  LambCoeffs c;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.one_minus_beta1 = 1.0f - h.beta1;
  c.one_minus_beta2 = 1.0f - h.beta2;
  c.eps = h.eps;
  c.weight_decay = h.weight_decay;
  c.inv_bc1 = h.bias_correction ? static_cast<float>(1.0 / BiasCorrection(h.beta1, h.step)) : 1.0f;
  c.inv_bc2 = h.bias_correction ? static_cast<float>(1.0 / BiasCorrection(h.beta2, h.step)) : 1.0f;
  c.grad_scale = h.common.grad_scale;
  return c;
}

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_COEFFICIENTS_H_
