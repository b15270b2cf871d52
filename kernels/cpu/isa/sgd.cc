// Fused SGD with momentum, dampening and Nesterov (torch.optim.SGD semantics).
// Compiled once per instruction set; see loops.h.
#include "kernels/cpu/isa/segment_loop.h"

namespace zero::kernels::cpu::ZERO_ISA_NS {

void SgdLoop(const SgdCoeffs& c, SegmentTypes types, const Segment* segments, int64_t count,
             int threads) {
  DispatchTypes(types, [&](auto param_tag, auto grad_tag) {
    const Vec neg_lr = Set(-c.lr), momentum = Set(c.momentum),
              one_minus_dampening = Set(c.one_minus_dampening),
              weight_decay = Set(c.weight_decay), grad_scale = Set(c.grad_scale);
    const bool use_momentum = c.momentum != 0.0f;
    ForEachSegmentVector(types, segments, count, threads, [&](const Pointers& p) {
      Vec weight = LoadF32(p.master);
      Vec grad = MulAdd(weight, weight_decay, Mul(Load(grad_tag, p.grad), grad_scale));
      if (use_momentum) {
        Vec buffer = c.first_step
                         ? grad
                         : MulAdd(grad, one_minus_dampening, Mul(LoadF32(p.state0), momentum));
        StoreF32(p.state0, buffer);
        grad = c.nesterov ? MulAdd(buffer, momentum, grad) : buffer;
      }
      weight = MulAdd(grad, neg_lr, weight);
      StoreF32(p.master, weight);
      Store(param_tag, p.model_param, weight);
    });
  });
}

}  // namespace zero::kernels::cpu::ZERO_ISA_NS
