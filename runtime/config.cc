// Config from JSON (nlohmann/json), with errors that name the key.
#include "zero/config.h"

#include <cmath>
#include <functional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace zero {
namespace {

using Json = nlohmann::json;

Status KeyError(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("config key \"", key, "\": ", what));
}

// Reads an object's keys through one handler each; any other key is an error naming it.
using Handler = std::function<Status(const Json&, const std::string& key)>;
Status ReadObject(const Json& object, const std::string& prefix,
                  const std::map<std::string, Handler>& handlers) {
  if (!object.is_object()) return KeyError(prefix.empty() ? "(top level)" : prefix, "must be an object");
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    auto handler = handlers.find(it.key());
    if (handler == handlers.end()) {
      std::string known;
      for (const auto& [name, unused] : handlers) absl::StrAppend(&known, known.empty() ? "" : ", ", name);
      return KeyError(key, absl::StrCat("unknown key; known keys here: ", known));
    }
    ZERO_RETURN_IF_ERROR(handler->second(it.value(), key));
  }
  return absl::OkStatus();
}

template <typename T>
Handler Number(T* out) {
  return [out](const Json& v, const std::string& key) -> Status {
    if (!v.is_number()) return KeyError(key, "must be a number");
    if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer()) {
        const double d = v.get<double>();
        if (d != std::floor(d)) return KeyError(key, "must be a whole number");
      }
      *out = static_cast<T>(v.get<double>());
    } else {
      *out = v.get<T>();
    }
    return absl::OkStatus();
  };
}

Handler Bool(bool* out) {
  return [out](const Json& v, const std::string& key) -> Status {
    if (!v.is_boolean()) return KeyError(key, "must be true or false");
    *out = v.get<bool>();
    return absl::OkStatus();
  };
}

// A string that must be one of `choices`.
template <typename E>
Handler Choice(E* out, std::map<std::string, E> choices) {
  return [out, choices](const Json& v, const std::string& key) -> Status {
    std::string names;
    for (const auto& [name, unused] : choices) absl::StrAppend(&names, names.empty() ? "" : ", ", name);
    if (!v.is_string()) return KeyError(key, absl::StrCat("must be one of ", names));
    auto it = choices.find(v.get<std::string>());
    if (it == choices.end()) {
      return KeyError(key, absl::StrCat("\"", v.get<std::string>(), "\" is not one of ", names));
    }
    *out = it->second;
    return absl::OkStatus();
  };
}

Handler DTypeKey(DType* out) {
  return Choice(out, std::map<std::string, DType>{
                         {"fp32", DType::kFP32}, {"bf16", DType::kBF16}, {"fp16", DType::kFP16}});
}

Status RangeError(const char* key, double value, const char* rule) {
  return KeyError(key, absl::StrCat(value, " is out of range: ", rule));
}

}  // namespace

const char* OptimizerTypeName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdam: return "adam";
    case OptimizerType::kAdamW: return "adamw";
    case OptimizerType::kSgd: return "sgd";
    case OptimizerType::kLamb: return "lamb";
    case OptimizerType::kLion: return "lion";
  }
  return "?";
}

StatusOr<Config> Config::FromJson(std::string_view text) {
  Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError("config is not valid JSON");
  Config c;
  OptimizerConfig& o = c.optimizer;
  auto betas = [&o](const Json& v, const std::string& key) -> Status {
    if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) {
      return KeyError(key, "must be a list of two numbers [beta1, beta2]");
    }
    o.beta1 = v[0].get<float>();
    o.beta2 = v[1].get<float>();
    return absl::OkStatus();
  };
  auto device = [&c](const Json& v, const std::string& key) -> Status {
    return Choice(&c.device, std::map<std::string, Device>{{"cpu", Device::kCpu}, {"cuda", Device::kCuda}})(v, key);
  };
  const std::map<std::string, Handler> optimizer = {
      {"type", Choice(&o.type, std::map<std::string, OptimizerType>{
                                   {"adam", OptimizerType::kAdam}, {"adamw", OptimizerType::kAdamW},
                                   {"sgd", OptimizerType::kSgd}, {"lamb", OptimizerType::kLamb},
                                   {"lion", OptimizerType::kLion}})},
      {"lr", Number(&o.lr)}, {"betas", betas}, {"eps", Number(&o.eps)},
      {"weight_decay", Number(&o.weight_decay)}, {"momentum", Number(&o.momentum)},
      {"dampening", Number(&o.dampening)}, {"nesterov", Bool(&o.nesterov)}};
  const std::map<std::string, Handler> precision = {
      {"param", DTypeKey(&c.precision.param)}, {"grad", DTypeKey(&c.precision.grad)},
      {"reduce", DTypeKey(&c.precision.reduce)}, {"master_weights", Bool(&c.precision.master_weights)}};
  const std::map<std::string, Handler> buckets = {
      {"reduce_bucket_elems", Number(&c.buckets.reduce_bucket_elems)},
      {"first_bucket_elems", Number(&c.buckets.first_bucket_elems)},
      {"overlap", Bool(&c.buckets.overlap)}, {"pool_buffers", Number(&c.buckets.pool_buffers)}};
  const std::map<std::string, Handler> stage3 = {
      {"prefetch_elems", Number(&c.stage3.prefetch_elems)},
      {"max_live_elems", Number(&c.stage3.max_live_elems)},
      {"persistence_threshold", Number(&c.stage3.persistence_threshold)}};
  const std::map<std::string, Handler> loss_scale = {
      {"mode", Choice(&c.loss_scale.mode, std::map<std::string, LossScaleMode>{
                                              {"none", LossScaleMode::kNone},
                                              {"static", LossScaleMode::kStatic},
                                              {"dynamic", LossScaleMode::kDynamic}})},
      {"initial_power", Number(&c.loss_scale.initial_power)}, {"window", Number(&c.loss_scale.window)},
      {"hysteresis", Number(&c.loss_scale.hysteresis)}, {"min", Number(&c.loss_scale.min)}};
  const std::map<std::string, Handler> guard = {
      {"on_duplicate", Choice(&c.guard.on_duplicate, std::map<std::string, DuplicatePolicy>{
                                                         {"error", DuplicatePolicy::kError},
                                                         {"count", DuplicatePolicy::kCount}})},
      {"on_unused", Choice(&c.guard.on_unused, std::map<std::string, UnusedPolicy>{
                                                   {"error", UnusedPolicy::kError},
                                                   {"zero", UnusedPolicy::kZero}})},
      {"consistency_check", Bool(&c.guard.consistency_check)}, {"timeout_s", Number(&c.guard.timeout_s)},
      {"init_params", Choice(&c.guard.init_params, std::map<std::string, InitParams>{
                                                       {"broadcast", InitParams::kBroadcast},
                                                       {"verify", InitParams::kVerify}})},
      {"replica_check_every", Number(&c.guard.replica_check_every)}};
  auto section = [](const std::map<std::string, Handler>& handlers) -> Handler {
    return [&handlers](const Json& v, const std::string& key) { return ReadObject(v, key, handlers); };
  };
  const std::map<std::string, Handler> top = {
      {"stage", Number(&c.stage)}, {"device", device}, {"optimizer", section(optimizer)},
      {"precision", section(precision)}, {"buckets", section(buckets)}, {"stage3", section(stage3)},
      {"gradient_accumulation_steps", Number(&c.gradient_accumulation_steps)},
      {"clip_grad_norm", Number(&c.clip_grad_norm)}, {"loss_scale", section(loss_scale)},
      {"guard", section(guard)}};
  ZERO_RETURN_IF_ERROR(ReadObject(json, "", top));
  ZERO_RETURN_IF_ERROR(c.Validate());
  return c;
}

Status Config::Validate() const {
  if (stage < 0 || stage > 3) return RangeError("stage", stage, "0, 1, 2 or 3");
  const OptimizerConfig& o = optimizer;
  if (!(o.lr >= 0 && std::isfinite(o.lr))) return RangeError("optimizer.lr", o.lr, "≥ 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) return RangeError("optimizer.betas", o.beta1, "beta1 in [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) return RangeError("optimizer.betas", o.beta2, "beta2 in [0, 1)");
  if (!(o.eps > 0)) return RangeError("optimizer.eps", o.eps, "> 0");
  if (!(o.weight_decay >= 0)) return RangeError("optimizer.weight_decay", o.weight_decay, "≥ 0");
  if (!(o.momentum >= 0 && o.momentum <= 1)) return RangeError("optimizer.momentum", o.momentum, "[0, 1]");
  if (!(o.dampening >= 0 && o.dampening <= 1)) return RangeError("optimizer.dampening", o.dampening, "[0, 1]");
  if (o.nesterov && (o.momentum == 0 || o.dampening != 0)) {
    return KeyError("optimizer.nesterov", "needs momentum > 0 and dampening = 0");
  }
  if (buckets.reduce_bucket_elems < 1) return RangeError("buckets.reduce_bucket_elems", buckets.reduce_bucket_elems, "≥ 1");
  if (buckets.first_bucket_elems < 1) return RangeError("buckets.first_bucket_elems", buckets.first_bucket_elems, "≥ 1");
  if (buckets.pool_buffers < 1) return RangeError("buckets.pool_buffers", buckets.pool_buffers, "≥ 1");
  if (stage3.prefetch_elems < 0) return RangeError("stage3.prefetch_elems", stage3.prefetch_elems, "≥ 0");
  if (stage3.max_live_elems < 1) return RangeError("stage3.max_live_elems", stage3.max_live_elems, "≥ 1");
  if (stage3.persistence_threshold < 0) return RangeError("stage3.persistence_threshold", stage3.persistence_threshold, "≥ 0");
  if (gradient_accumulation_steps < 1) return RangeError("gradient_accumulation_steps", gradient_accumulation_steps, "≥ 1");
  if (!(clip_grad_norm >= 0)) return RangeError("clip_grad_norm", clip_grad_norm, "≥ 0 (0 disables clipping)");
  if (loss_scale.initial_power < 0 || loss_scale.initial_power > 64) {
    return RangeError("loss_scale.initial_power", loss_scale.initial_power, "0..64");
  }
  if (loss_scale.window < 1) return RangeError("loss_scale.window", loss_scale.window, "≥ 1");
  if (loss_scale.hysteresis < 1) return RangeError("loss_scale.hysteresis", loss_scale.hysteresis, "≥ 1");
  if (!(loss_scale.min > 0)) return RangeError("loss_scale.min", loss_scale.min, "> 0");
  if (!(guard.timeout_s >= 0)) return RangeError("guard.timeout_s", guard.timeout_s, "≥ 0 (0 waits forever)");
  if (guard.replica_check_every < 0) {
    return RangeError("guard.replica_check_every", guard.replica_check_every, "≥ 0 (0 never checks)");
  }
  return absl::OkStatus();
}

}  // namespace zero
