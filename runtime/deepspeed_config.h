// DeepSpeed's JSON config translated into ZeroRT's (internal to runtime; Config::FromJson calls
// it, so every front door takes either).
#ifndef ZERO_RUNTIME_DEEPSPEED_CONFIG_H_
#define ZERO_RUNTIME_DEEPSPEED_CONFIG_H_

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero/status.h"

namespace zero::runtime {

/// Whether `config` is a DeepSpeed config: a JSON object with one of DeepSpeed's top-level keys
/// that ZeroRT's config does not have (zero_optimization, fp16, bf16, train_batch_size,
/// train_micro_batch_size_per_gpu, gradient_clipping, ...).
bool IsDeepSpeedConfig(const nlohmann::json& config);

/// ZeroRT's JSON for DeepSpeed config `config`. Keys that only tune DeepSpeed's internals are
/// accepted, each with a line in `notes` (logged at INFO by the engine). Every unsupported key
/// or value is named in one kInvalidArgument, each with what to do.
StatusOr<nlohmann::json> TranslateDeepSpeedConfig(const nlohmann::json& config,
                                                  std::vector<std::string>* notes);

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_DEEPSPEED_CONFIG_H_
