// Fused Lion: sign of the interpolated momentum as the update, one pass over p, g, m.
// Compiled once per instruction set; see loops.h.
#include "kernels/cpu/isa/segment_loop.h"

namespace zero::kernels::cpu::ZERO_ISA_NS {

void LionLoop(const LionCoeffs& c, SegmentTypes types, const Segment* segments, int64_t count,
              int threads) {
  DispatchTypes(types, [&](auto param_tag, auto grad_tag) {
    const Vec neg_lr = Set(-c.lr), beta1 = Set(c.beta1), one_minus_beta1 = Set(c.one_minus_beta1),
              beta2 = Set(c.beta2), one_minus_beta2 = Set(c.one_minus_beta2),
              decay_factor = Set(c.decay_factor), grad_scale = Set(c.grad_scale);
    ForEachSegmentVector(types, segments, count, threads, [&](const Pointers& p) {
      const Vec grad = Mul(Load(grad_tag, p.grad), grad_scale);
      const Vec m = LoadF32(p.state0);
      const Vec direction = Sign(MulAdd(grad, one_minus_beta1, Mul(m, beta1)));
      const Vec weight = MulAdd(direction, neg_lr, Mul(LoadF32(p.master), decay_factor));
      StoreF32(p.master, weight);
      Store(param_tag, p.model_param, weight);
      StoreF32(p.state0, MulAdd(grad, one_minus_beta2, Mul(m, beta2)));
    });
  });
}

}  // namespace zero::kernels::cpu::ZERO_ISA_NS
