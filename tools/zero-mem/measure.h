// zero-mem measure: runs the engine on a model of the given shape for a few steps and reads the
// accounting allocator's peak bytes per category (rank 0's).
#ifndef ZERO_TOOLS_ZERO_MEM_MEASURE_H_
#define ZERO_TOOLS_ZERO_MEM_MEASURE_H_

#include <cstdint>
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
};

/// Peak bytes per category on rank 0 after training `options` at `stage` on `ranks`
/// in-process ranks; kUnimplemented where the engine does not support the stage yet.
StatusOr<MemoryStats> MeasureLocal(const MeasureOptions& options, int stage, int ranks);

}  // namespace zero::tools

#endif  // ZERO_TOOLS_ZERO_MEM_MEASURE_H_
