// zero-mem measure: runs the engine on a model of the given shape for a few steps and reads the
// accounting allocator's peak bytes per category (rank 0's).
#ifndef ZERO_TOOLS_ZERO_MEM_MEASURE_H_
#define ZERO_TOOLS_ZERO_MEM_MEASURE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "zero/config.h"
#include "zero/memory.h"

namespace zero::tools {

struct MeasureOptions {
  int layers = 8;
  int width = 512;
  int steps = 2;
  DType dtype = DType::kBF16;       ///< the params'
  DType grad_dtype = DType::kBF16;  ///< precision.grad (and reduce): dtype, or fp32
  OptimizerType optimizer = OptimizerType::kAdamW;
  /// > 0: a LoRA model: each layer's width² weight is frozen (a unit of its own) and trains a
  /// rank-`lora_rank` adapter (two width × lora_rank matrices, one unit) beside it.
  int lora_rank = 0;
};

/// The (trainable, frozen) parameter counts of the model `options` describe.
std::pair<double, double> ModelParams(const MeasureOptions& options);

/// Peak bytes per category on rank 0 after training `options` at `stage` on `ranks`
/// in-process ranks; kUnimplemented where the engine does not support the stage yet.
StatusOr<MemoryStats> MeasureLocal(const MeasureOptions& options, int stage, int ranks);

}  // namespace zero::tools

#endif  // ZERO_TOOLS_ZERO_MEM_MEASURE_H_
