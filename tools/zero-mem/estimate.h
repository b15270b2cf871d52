// Per-rank memory of model states by ZeRO stage (DESIGN.md's table, the ZeRO paper's
// formulas) and DeepSpeed's own estimator figures, for zero-mem.
#ifndef ZERO_TOOLS_ZERO_MEM_ESTIMATE_H_
#define ZERO_TOOLS_ZERO_MEM_ESTIMATE_H_

#include <string>

#include "zero/status.h"

namespace zero::tools {

/// Bytes per parameter of each kind of model state.
struct StateBytes {
  double param = 2, grad = 2;  ///< the model copy and its gradient
  double optimizer = 12;       ///< K: fp32 master (if any) + moments
};

/// Bytes per parameter for `precision` ("mixed": 16-bit params with fp32 master, or "fp32"),
/// `optimizer` (adamw, adam, sgd = with momentum, lion) and the gradient dtype `grad_dtype`
/// (precision.grad): "bf16" (mixed only: 2 bytes, the ZeRO paper's), "fp32" (4 bytes), or ""
/// for the params' own (2 bytes with mixed, 4 with fp32).
StatusOr<StateBytes> BytesPerParam(const std::string& precision, const std::string& optimizer,
                                   const std::string& grad_dtype);

/// Per-rank bytes of model states at `stage` with `params` parameters over `ranks` ranks:
/// 0 (P+G+K)Ψ, 1 (P+G)Ψ + KΨ/N, 2 PΨ + (G+K)Ψ/N, 3 (P+G+K)Ψ/N.
double StageBytes(int stage, double params, int ranks, const StateBytes& b);

/// Per-rank bytes of `frozen` parameters (never stepped: no gradient, no optimizer state): the
/// model copy, replicated at stages 0-2 and sharded at stage 3.
double FrozenBytes(int stage, double frozen, int ranks, const StateBytes& b);

/// DeepSpeed's estimators without offload (estimate_zero2/zero3_model_states_mem_needs, mixed
/// precision Adam): ZeRO-2 4P + 16P/N, ZeRO-3 4·L + 18P/N with L the largest layer's parameter
/// count.
double DeepSpeedZero2Bytes(double params, int ranks);
double DeepSpeedZero3Bytes(double params, double largest_layer, int ranks);

}  // namespace zero::tools

#endif  // ZERO_TOOLS_ZERO_MEM_ESTIMATE_H_
