// Fused Adam/AdamW: one pass reads p, g, m, v and writes p, m, v (and the bf16/fp16 copy).
// Compiled once per instruction set; see loops.h.
#include "kernels/cpu/isa/segment_loop.h"

namespace zero::kernels::cpu::ZERO_ISA_NS {

void AdamLoop(const AdamCoeffs& c, SegmentTypes types, const Segment* segments, int64_t count,
              int threads) {
  DispatchTypes(types, [&](auto param_tag, auto grad_tag) {
    const Vec beta2 = Set(c.beta2), one_minus_beta1 = Set(c.one_minus_beta1),
              one_minus_beta2 = Set(c.one_minus_beta2), eps = Set(c.eps),
              l2_decay = Set(c.l2_decay), decay_factor = Set(c.decay_factor),
              neg_step_size = Set(-c.step_size), inv_bc2_sqrt = Set(c.inv_bc2_sqrt),
              grad_scale = Set(c.grad_scale);
    ForEachSegmentVector(types, segments, count, threads, [&](const Pointers& p) {
      Vec weight = LoadF32(p.master);
      Vec grad = Mul(Load(grad_tag, p.grad), grad_scale);
      grad = MulAdd(weight, l2_decay, grad);    // Adam's L2 term (0 for AdamW)
      weight = Mul(weight, decay_factor);       // AdamW's decoupled decay (1 for Adam)
      Vec m = LoadF32(p.state0);
      m = MulAdd(Sub(grad, m), one_minus_beta1, m);  // m.lerp_(g, 1 - β1)
      Vec v = LoadF32(p.state1);
      v = MulAdd(Mul(grad, grad), one_minus_beta2, Mul(v, beta2));
      const Vec denom = MulAdd(Sqrt(v), inv_bc2_sqrt, eps);
      weight = MulAdd(Div(m, denom), neg_step_size, weight);
      StoreF32(p.master, weight);
      Store(param_tag, p.model_param, weight);
      StoreF32(p.state0, m);
      StoreF32(p.state1, v);
    });
  });
}

}  // namespace zero::kernels::cpu::ZERO_ISA_NS
