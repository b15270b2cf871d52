// LAMB in two fused passes: the update direction (moments + decay, written to a workspace),
// then the trust-ratio-scaled apply. The norms between them come from SquaresLoop.
// Compiled once per instruction set; see loops.h.
#include "kernels/cpu/isa/segment_loop.h"

namespace zero::kernels::cpu::ZERO_ISA_NS {

void LambUpdateLoop(const LambCoeffs& c, SegmentTypes types, const Segment* segments,
                    float* const* updates, int64_t count, int threads) {
  const int grad_bytes = ElementBytes(types.grad);
  DispatchTypes(types, [&](auto, auto grad_tag) {
    const Vec beta2 = Set(c.beta2), one_minus_beta1 = Set(c.one_minus_beta1),
              one_minus_beta2 = Set(c.one_minus_beta2), eps = Set(c.eps),
              weight_decay = Set(c.weight_decay), inv_bc1 = Set(c.inv_bc1),
              inv_bc2 = Set(c.inv_bc2), grad_scale = Set(c.grad_scale);
    auto op = [&](const Pointers& p) {
      const Vec grad = Mul(Load(grad_tag, p.grad), grad_scale);
      Vec m = LoadF32(p.state0);
      m = MulAdd(Sub(grad, m), one_minus_beta1, m);
      Vec v = LoadF32(p.state1);
      v = MulAdd(Mul(grad, grad), one_minus_beta2, Mul(v, beta2));
      const Vec denom = Add(Sqrt(Mul(v, inv_bc2)), eps);
      const Vec update = MulAdd(LoadF32(p.master), weight_decay, Div(Mul(m, inv_bc1), denom));
      StoreF32(p.state0, m);
      StoreF32(p.state1, v);
      StoreF32(p.update_out, update);
    };
    ForEachChunk(
        count, threads, [segments](int64_t i) { return segments[i].numel; },
        [&](int64_t i, int64_t, int64_t begin, int64_t end) {
          const Segment& s = segments[i];
          const Pointers base = {s.master, nullptr, s.grad, s.state0, s.state1, nullptr, updates[i]};
          ForEachVector(base, begin, end, 2, grad_bytes, op);
        });
  });
}

void LambApplyLoop(float lr, const float* trust_ratios, DType param_type,
                   const Segment* segments, const float* const* updates, int64_t count,
                   int threads) {
  DispatchTypes({param_type, DType::kFP32}, [&](auto param_tag, auto) {
    const int param_bytes = ElementBytes(param_type);
    ForEachChunk(
        count, threads, [segments](int64_t i) { return segments[i].numel; },
        [&](int64_t i, int64_t, int64_t begin, int64_t end) {
          const Segment& s = segments[i];
          const Vec neg_step = Set(-lr * trust_ratios[i]);
          const Pointers base = {s.master, s.model_param, nullptr, nullptr, nullptr, updates[i], nullptr};
          ForEachVector(base, begin, end, param_bytes, 4, [&](const Pointers& p) {
            const Vec weight = MulAdd(LoadF32(p.update), neg_step, LoadF32(p.master));
            StoreF32(p.master, weight);
            Store(param_tag, p.model_param, weight);
          });
        });
  });
}

}  // namespace zero::kernels::cpu::ZERO_ISA_NS
