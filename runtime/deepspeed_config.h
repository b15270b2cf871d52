// DeepSpeed's JSON config translated into ZeroRT's (internal to runtime; Config::FromJson calls
// it, so every front door takes either).
#ifndef ZERO_RUNTIME_DEEPSPEED_CONFIG_H_
#define ZERO_RUNTIME_DEEPSPEED_CONFIG_H_

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero/status.h"

namespace zero::runtime {

/// Whether `config` is a DeepSpeed config: a JSON object with one of DeepSpeed's top-level keys
/// that ZeroRT's config does not have (zero_optimization, fp16, bf16, train_batch_size,
/// train_micro_batch_size_per_gpu, gradient_clipping, ...), an "optimizer" with "params", or
/// a "checkpoint" with one of DeepSpeed's own keys (tag_validation, ...). Keys both
/// configs have (optimizer, scheduler, gradient_accumulation_steps, checkpoint, device) do not
/// otherwise make it one. A translation is never a DeepSpeed config.
bool IsDeepSpeedConfig(const nlohmann::json& config);

/// ZeroRT key -> the DeepSpeed key its value was copied from (TranslateDeepSpeedConfig).
using KeyOrigins = std::map<std::string, std::string>;

/// ZeroRT's JSON for DeepSpeed config `config`, with DeepSpeed's defaults written out where they
/// change the numbers (stage 0, clipping at 1.0, Adam as AdamW with weight decay 0, gradients in
/// the model's dtype, bf16 steps skipped on Inf/NaN). Values are copied as written: ZeroRT's
/// parser checks them afterwards. Keys that only tune DeepSpeed's internals (and "auto" values
/// resolved here) are accepted, each with a "<dotted.key>: <text>" line appended to `notes`
/// (which may be null; nothing is appended on error). Every unsupported key or value is named
/// in one kInvalidArgument: "DeepSpeed config: N keys are not supported:" and then one
/// "<dotted.key>: <what to do>" line each. `origins` (may be null) receives, for each ZeroRT
/// key a DeepSpeed key's value was copied to, that DeepSpeed key ("stage" from
/// "zero_optimization.stage"; values derived from several keys, as the precision, have none).
StatusOr<nlohmann::json> TranslateDeepSpeedConfig(const nlohmann::json& config,
                                                  std::vector<std::string>* notes, KeyOrigins* origins = nullptr);

/// `message`, an error of ZeroRT's parser about a translation, with each `config key "k"` whose
/// k (before an index, "optimizer.betas[1]") came from a DeepSpeed key named as that key:
/// `DeepSpeed key "optimizer.params.betas[1]" (ZeroRT's "optimizer.betas[1]")`.
std::string NameDeepSpeedKeys(const std::string& message, const KeyOrigins& origins);

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_DEEPSPEED_CONFIG_H_
