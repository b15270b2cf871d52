// zero-ckpt's commands, each on one checkpoint directory (or a series root with `latest`).
#ifndef ZERO_TOOLS_ZERO_CKPT_COMMANDS_H_
#define ZERO_TOOLS_ZERO_CKPT_COMMANDS_H_

#include <string>

#include "zero/dtype.h"
#include "zero/status.h"

namespace zero::tools {

/// Prints format, world, stage, step, optimizer, params with shapes, each file with its size,
/// records and whether its checksums match (every record is read), and the total bytes.
/// Returns the first problem found (after printing everything).
Status Inspect(const std::string& dir);

/// Checks that every file is present, every checksum matches and the records cover every
/// saved param exactly; prints one line. OK only if the checkpoint is complete and intact.
Status Verify(const std::string& dir);

/// kInvalidArgument when writing `out` would damage the input: the checkpoint directory
/// `checkpoint_dir` that `dir` (a checkpoint, or a series root) names, or what the series
/// needs to resume (its `latest`, its lock, one of its checkpoints), whether `dir` is the
/// series root or one checkpoint of it. Absolute paths, symlinks resolved.
Status OutputOutsideInput(const std::string& dir, const std::string& checkpoint_dir, const std::string& out);

/// Writes the full params (fp32 masters, as `dtype`: fp32 or bf16) into a safetensors file
/// keyed by param name: trainable params, and frozen ones where the checkpoint saved them
/// (checkpoint.save_frozen).
Status Consolidate(const std::string& dir, const std::string& out, DType dtype);

/// Loads the checkpoint on `world` in-process ranks and saves it again into `out` (offline
/// resharding, so that a job at that rank count starts from files of its own shape).
Status Reshard(const std::string& dir, int world, const std::string& out);

}  // namespace zero::tools

#endif  // ZERO_TOOLS_ZERO_CKPT_COMMANDS_H_
