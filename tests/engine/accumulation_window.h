// The two-param model the full-state and clip tests train: its registration, and one step's
// accumulation window on one rank with the gradients of reference_adamw.h.
#ifndef ZERO_TESTS_ENGINE_ACCUMULATION_WINDOW_H_
#define ZERO_TESTS_ENGINE_ACCUMULATION_WINDOW_H_

#include <cstdint>
#include <vector>

#include "tests/engine/reference_adamw.h"
#include "zero/engine.h"

namespace zero::testing {

// Registers "w" (numel[0] elements) and "b" (numel[1]), one stage-3 unit each, finalizes,
// and sets both to InitialValues.
inline Status RegisterTwoParams(Engine& engine, const int64_t (&numel)[2]) {
  for (int p = 0; p < 2; ++p) {
    ZERO_RETURN_IF_ERROR(engine.RegisterParam({p == 0 ? "w" : "b", {numel[p]}, DType::kFP32, true, 0, p}).status());
  }
  ZERO_RETURN_IF_ERROR(engine.Finalize());
  for (int p = 0; p < 2; ++p) ZERO_RETURN_IF_ERROR(engine.SetParam(p, InitialValues(p, numel[p]).data()));
  return absl::OkStatus();
}

// Step `step`'s window on rank `rank`: `micro_batches` micro-batches, each handing over
// MicroGradient × `loss_scale` for "b", then "w" (at stage 3 each unit gathered around it).
inline Status RunWindow(Engine& engine, const int64_t (&numel)[2], int stage, int step, int rank, int micro_batches,
                        float loss_scale) {
  for (int micro = 0; micro < micro_batches; ++micro) {
    ZERO_RETURN_IF_ERROR(engine.BeginIteration());
    for (int p : {1, 0}) {
      if (stage == 3) ZERO_RETURN_IF_ERROR(engine.Gather(p));
      std::vector<float> g = MicroGradient(p, numel[p], step, micro, rank);
      for (float& x : g) x *= loss_scale;
      ZERO_RETURN_IF_ERROR(engine.AccumulateGrad(p, g.data()));
      if (stage == 3) ZERO_RETURN_IF_ERROR(engine.Release(p));
    }
    ZERO_RETURN_IF_ERROR(engine.EndBackward());
  }
  return absl::OkStatus();
}

}  // namespace zero::testing

#endif  // ZERO_TESTS_ENGINE_ACCUMULATION_WINDOW_H_
