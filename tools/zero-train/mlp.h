// zero-train's model: a multi-layer perceptron learning a fixed random teacher on synthetic
// data, data-parallel (each rank its own slice of every batch), written against ZeroRT's
// public API only. Optional patterns that exercise the gradient guard:
//   tied       the output projection reuses layer0.weight (transposed): its gradient arrives
//              twice per step, as with tied embeddings;
//   branch     a branch.weight used on even steps only: on odd steps no rank uses it;
//   recompute  the middle layer's weight gradient is delivered in two parts, the way reentrant
//              activation checkpointing re-fires a hook.
#ifndef ZERO_TOOLS_ZERO_TRAIN_MLP_H_
#define ZERO_TOOLS_ZERO_TRAIN_MLP_H_

#include <cstdint>
#include <vector>

#include "zero/engine.h"

namespace zero::tools {

struct MlpOptions {
  int depth = 4;         ///< hidden layers
  int width = 128;       ///< every layer's width (inputs and outputs too)
  int batch = 16;        ///< samples per rank per step
  int micro_batches = 1; ///< = gradient_accumulation_steps
  bool tied = false, branch = false, recompute = false;
  DType dtype = DType::kFP32;
  uint64_t seed = 1;
};

class Mlp {
 public:
  explicit Mlp(const MlpOptions& options) : o_(options) {}

  /// Registers every param (forward order), finalizes and sets the initial values (the same
  /// on every rank).
  Status Setup(Engine& engine);
  /// One optimizer step: the rank's micro-batches through forward, backward and the engine.
  /// Returns the rank's mean loss over its samples (before the update).
  StatusOr<double> TrainStep(Engine& engine, int step, float loss_scale);
  /// A checksum of every param's full value, identical on every rank.
  StatusOr<double> Checksum(Engine& engine) const;

 private:
  struct Grads;
  int head_weight() const;  // the param whose weight projects to the output
  // Every param's full value, read unit by unit through Gather/ParamData/Release (stage 3
  // gathers each layer's shards; at stages 0-2 the calls are free).
  StatusOr<std::vector<std::vector<float>>> ReadParams(Engine& engine) const;
  Status Hand(Engine& engine, int param, const std::vector<float>& grad, float scale) const;

  MlpOptions o_;
  std::vector<ParamId> ids_;
  std::vector<int64_t> numel_;
  std::vector<int> unit_;  // per param: its stage-3 unit (one per layer)
  int branch_ = -1, head_weight_ = -1, head_bias_ = -1;
};

}  // namespace zero::tools

#endif  // ZERO_TOOLS_ZERO_TRAIN_MLP_H_
