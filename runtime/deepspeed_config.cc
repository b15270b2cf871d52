// DeepSpeed's JSON config translated into ZeroRT's. Each DeepSpeed section is a table of
// key → handler. A handler either writes its ZeroRT key, records a note (a key that only tunes
// DeepSpeed's internals), records an unsupported key with what to do, or keeps the value for
// Finish(), which combines keys that meet in one ZeroRT key (fp16 + bf16 + data_types →
// precision and loss_scale; the three batch keys; optimizer type + params).
//
// Defaults: where DeepSpeed's default changes the numbers (weight decay, clipping, gradient
// dtype, skipped steps, ZeRO stage) the translation writes DeepSpeed's value; where it only
// changes speed (bucket sizes, overlap_comm) ZeroRT's own default stays. DeepSpeed facts are
// from deepspeedai/DeepSpeed v0.19.6 (deepspeed/runtime/{config,constants,engine,
// precision_config,lr_schedules}.py, deepspeed/runtime/zero/config.py, deepspeed/ops/).
#include "runtime/deepspeed_config.h"

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zero::runtime {
namespace {

using Json = nlohmann::json;
using Pointer = Json::json_pointer;

/// The translation under way.
struct Translation {
  Json out = Json::object();             ///< the ZeroRT config
  std::vector<std::string> notes;        ///< "key: text"
  std::vector<std::string> unsupported;  ///< "key: what to do"
  std::map<std::string, Json> given;     ///< values kept for Finish(), by dotted key

  void Note(const std::string& key, const std::string& text) { notes.push_back(key + ": " + text); }
  void Unsupported(const std::string& key, const std::string& what) {
    unsupported.push_back(key + ": " + what);
  }
  /// A kept value, or null when the config does not have it.
  const Json& Given(const std::string& key) const {
    static const Json kNull;
    auto it = given.find(key);
    return it == given.end() ? kNull : it->second;
  }
};

/// Handles the value at dotted key `key`.
using Handler = std::function<void(const Json& value, const std::string& key, Translation& t)>;
using Table = std::map<std::string, Handler>;

bool IsAuto(const Json& v) { return v.is_string() && v.get<std::string>() == "auto"; }
/// `object[key]`, or null when `object` is not an object or lacks `key`.
const Json& Member(const Json& object, const std::string& key) {
  static const Json kNull;
  auto it = object.is_object() ? object.find(key) : object.end();
  return it == object.end() ? kNull : *it;
}
/// `object[key]` when it is a string, else "".
std::string StringMember(const Json& object, const std::string& key) {
  const Json& v = Member(object, key);
  return v.is_string() ? v.get<std::string>() : "";
}
std::string Quoted(const Json& v) { return v.dump(); }
std::string Dotted(const std::string& pointer) {  // "/buckets/overlap" → "buckets.overlap"
  std::string key = pointer.substr(1);
  for (char& c : key) c = c == '/' ? '.' : c;
  return key;
}

/// Hugging Face's Trainer writes "auto" and fills it in before DeepSpeed reads the config.
void AutoUnsupported(Translation& t, const std::string& key, const std::string& what) {
  t.Unsupported(key, "\"auto\" is filled in by Hugging Face's Trainer, which is not here; write " + what);
}

/// Writes `v` at ZeroRT's `pointer`; "auto" is unsupported, with `what` to write instead.
void Put(Translation& t, const std::string& key, const Json& v, const std::string& pointer,
         const std::string& what) {
  if (IsAuto(v)) return AutoUnsupported(t, key, what);
  t.out[Pointer(pointer)] = v;
}

// ---------------------------------------------------------------------------------------------
// Handler factories.

/// Copied to ZeroRT's `pointer` (ZeroRT's parser checks the value's type and range).
Handler To(std::string pointer, std::string what) {
  return [pointer, what](const Json& v, const std::string& key, Translation& t) { Put(t, key, v, pointer, what); };
}
/// A size that only tunes speed: copied, or with "auto" (which Hugging Face derives from the
/// model's hidden size) ZeroRT's default stays.
Handler Tuning(std::string pointer) {
  return [pointer](const Json& v, const std::string& key, Translation& t) {
    if (!IsAuto(v)) return void(t.out[Pointer(pointer)] = v);
    t.Note(key, "\"auto\" (Hugging Face derives it from the model's hidden size): ZeroRT's default " +
                    Dotted(pointer) + " is used");
  };
}
/// Kept for Finish().
Handler Keep() {
  return [](const Json& v, const std::string& key, Translation& t) { t.given[key] = v; };
}
/// Accepted and ignored, with a note saying `why`.
Handler Ignored(std::string why) {
  return [why](const Json&, const std::string& key, Translation& t) { t.Note(key, "ignored; " + why); };
}
/// Always unsupported.
Handler Refused(std::string what) {
  return [what](const Json&, const std::string& key, Translation& t) { t.Unsupported(key, what); };
}
/// Accepted when it is `accepted` (DeepSpeed's default) or null; any other value is unsupported.
Handler Requires(Json accepted, std::string otherwise) {
  return [accepted, otherwise](const Json& v, const std::string& key, Translation& t) {
    if (!v.is_null() && v != accepted) t.Unsupported(key, Quoted(v) + " is not supported; " + otherwise);
  };
}
/// A section {"enabled": ..., ...} that is unsupported unless it is disabled.
Handler Disabled(std::string what) {
  return [what](const Json& v, const std::string& key, Translation& t) {
    if (!v.is_object() || (!Member(v, "enabled").is_null() && Member(v, "enabled") != false)) t.Unsupported(key, what);
  };
}
/// A ZeRO offload section: accepted only with device "none" (DeepSpeed's default).
Handler Offload(std::string keeps) {
  return [keeps](const Json& v, const std::string& key, Translation& t) {
    if (v.is_null() || (v.is_object() && (Member(v, "device").is_null() || Member(v, "device") == "none"))) return;
    t.Unsupported(key, "not supported yet; remove it (ZeroRT keeps " + keeps + " on the engine's device)");
  };
}

/// Walks `object`'s keys through `table`; a key outside it (or outside `allowed`, when given,
/// which names what `owner` takes) is unsupported.
void Walk(const Json& object, const std::string& prefix, const Table& table, Translation& t,
          const std::set<std::string>* allowed = nullptr, const std::string& owner = "") {
  if (!object.is_object()) return t.Unsupported(prefix.empty() ? "(top level)" : prefix, Quoted(object) + " is not an object");
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    auto handler = table.find(it.key());
    if (handler == table.end()) {
      t.Unsupported(key, "not a DeepSpeed key that ZeroRT supports; remove it");
    } else if (allowed != nullptr && allowed->count(it.key()) == 0) {
      t.Unsupported(key, owner + " takes no " + it.key() + "; remove it");
    } else {
      handler->second(it.value(), key, t);
    }
  }
}
Handler Section(const Table& table) {
  return [&table](const Json& v, const std::string& key, Translation& t) { Walk(v, key, table, t); };
}

// ---------------------------------------------------------------------------------------------
// The tables.

const Table& ZeroOptimization() {
  static const Table table = {
      {"stage", To("/stage", "the ZeRO stage, 0 to 3")},
      {"reduce_bucket_size", Tuning("/buckets/reduce_bucket_elems")},
      {"overlap_comm", To("/buckets/overlap", "true or false")},
      {"stage3_prefetch_bucket_size", Tuning("/stage3/prefetch_elems")},
      {"stage3_max_live_parameters", Tuning("/stage3/max_live_elems")},
      {"stage3_param_persistence_threshold", Tuning("/stage3/persistence_threshold")},
      {"ignore_unused_parameters",
       [](const Json& v, const std::string& key, Translation& t) {
         if (!v.is_boolean()) return t.Unsupported(key, Quoted(v) + " is not true or false");
         t.out["guard"]["on_unused"] = v.get<bool>() ? "zero" : "error";
       }},
      {"offload_optimizer", Offload("optimizer states")},
      {"offload_param", Offload("params")},
      {"cpu_offload", Requires(false, "offload is not supported yet; remove it (ZeroRT keeps optimizer states on the engine's device)")},
      {"cpu_offload_param", Requires(false, "offload is not supported yet; remove it (ZeroRT keeps params on the engine's device)")},
      {"cpu_offload_use_pin_memory", Ignored("it concerns CPU offload, which ZeroRT does not do")},
      {"contiguous_gradients", Ignored("ZeroRT's gradients always live in contiguous flat bucket buffers")},
      {"allgather_bucket_size", Ignored("ZeroRT all-gathers whole buckets (stage 3: whole units); buckets.reduce_bucket_elems sizes them")},
      {"allgather_partitions", Ignored("ZeroRT always all-gathers the updated shards")},
      {"reduce_scatter", Ignored("ZeroRT reduce-scatters each bucket into the ranks' shards (all-reduce at stage 0)")},
      {"use_multi_rank_bucket_allreduce", Ignored("ZeroRT launches one collective per bucket")},
      {"round_robin_gradients", Ignored("it speeds up gradient copies for CPU offload, which ZeroRT does not do")},
      {"sub_group_size", Ignored("it tiles the optimizer step for offload; ZeroRT steps each rank's shard segments whole")},
      {"stage3_max_reuse_distance", Ignored("ZeroRT releases a stage-3 unit when the trainer calls Release")},
      {"stage3_gather_16bit_weights_on_model_save", Ignored("ZeroRT checkpoints hold the full fp32 master; zero-ckpt consolidates them")},
      {"stage3_gather_fp16_weights_on_model_save", Ignored("ZeroRT checkpoints hold the full fp32 master; zero-ckpt consolidates them")},
      {"elastic_checkpoint", Ignored("ZeroRT checkpoints load at any world size")},
      {"load_from_fp32_weights", Ignored("ZeroRT checkpoints always restore the fp32 master")},
      {"memory_efficient_linear", Ignored("ZeroRT does not wrap the model's layers")},
      {"zero_quantized_weights", Requires(false, "ZeRO++ quantized communication is not supported; remove it")},
      {"zero_quantized_gradients", Requires(false, "ZeRO++ quantized communication is not supported; remove it")},
      {"zero_hpz_partition_size", Requires(1, "ZeRO++ hierarchical partitioning is not supported; remove it")},
  };
  return table;
}

const Table& Fp16() {
  static const Table table = {
      {"enabled", Keep()}, {"loss_scale", Keep()}, {"initial_scale_power", Keep()},
      {"loss_scale_window", Keep()}, {"hysteresis", Keep()}, {"min_loss_scale", Keep()},
      {"consecutive_hysteresis", Requires(false, "ZeroRT refills the hysteresis only when the scale grows (DeepSpeed's default); remove it")},
      {"auto_cast", Requires(false, "ZeroRT does not see the model's inputs; cast them in the trainer and remove it")},
      {"fp16_master_weights_and_grads", Requires(false, "ZeroRT keeps an fp32 master copy; remove it")},
  };
  return table;
}

const Table& Bf16() {
  static const Table table = {
      {"enabled", Keep()}, {"check_grad_overflow", Keep()},
      {"immediate_grad_update", Ignored("ZeroRT adds each gradient into its bucket as it arrives, in data_types.grad_accum_dtype")},
      {"bf16_master_weights_and_grads", Requires(false, "ZeroRT keeps an fp32 master copy; remove it")},
      {"bf16_optimizer_states", Requires(false, "ZeroRT keeps optimizer states in fp32; remove it")},
  };
  return table;
}

const Table& DataTypes() {
  static const Table table = {
      {"grad_accum_dtype", Keep()}, {"param_dtype", Keep()},
      {"buffer_dtype", Requires(nullptr, "ZeroRT does not own the model's buffers; cast them in the trainer and remove it")},
  };
  return table;
}

/// optimizer.params: every key any type takes; OptimizerTypes() says which type takes which.
const Table& OptimizerParams() {
  static const Table table = {
      {"lr", To("/optimizer/lr", "the learning rate, e.g. 1e-4")},
      {"betas", To("/optimizer/betas", "[beta1, beta2], e.g. [0.9, 0.999]")},
      {"eps", To("/optimizer/eps", "epsilon, e.g. 1e-8")},
      {"weight_decay", To("/optimizer/weight_decay", "the weight decay, e.g. 0.01")},
      {"momentum", To("/optimizer/momentum", "the momentum, e.g. 0.9")},
      {"dampening", To("/optimizer/dampening", "the dampening, e.g. 0")},
      {"nesterov", To("/optimizer/nesterov", "true or false")},
      {"adam_w_mode", Keep()}, {"torch_adam", Keep()},
      {"bias_correction", Requires(true, "ZeroRT's Adam, AdamW and LAMB always correct the bias; remove it")},
      {"amsgrad", Requires(false, "AMSGrad is not supported (DeepSpeed's FusedAdam refuses it too); remove it")},
      {"eps_inside_sqrt", Requires(false, "ZeroRT's LAMB adds eps outside the square root; remove it")},
      {"max_coeff", Refused("ZeroRT's LAMB does not clamp the trust ratio; remove it")},
      {"min_coeff", Refused("ZeroRT's LAMB does not clamp the trust ratio; remove it")},
      {"max_grad_norm", Refused("write the top-level gradient_clipping instead (DeepSpeed refuses it here too)")},
  };
  return table;
}

/// A DeepSpeed optimizer type: the params keys it takes and DeepSpeed's weight decay when
/// params omits it (FusedAdam, FusedLamb and FusedLion in deepspeed/ops/ default it to 0, as
/// does torch.optim.SGD; deepspeed/runtime/engine.py, _configure_basic_optimizer).
struct OptimizerType {
  const char* zero_type;
  std::set<std::string> keys;
};
const std::map<std::string, OptimizerType>& OptimizerTypes() {
  static const std::set<std::string> adam = {"lr", "betas", "eps", "weight_decay", "adam_w_mode",
                                             "torch_adam", "bias_correction", "amsgrad", "max_grad_norm"};
  static const std::map<std::string, OptimizerType> types = {
      {"adam", {"adamw", adam}},  // FusedAdam's adam_w_mode defaults to true: AdamW
      {"adamw", {"adamw", adam}},
      {"lamb", {"lamb", {"lr", "betas", "eps", "weight_decay", "bias_correction", "amsgrad",
                         "eps_inside_sqrt", "max_coeff", "min_coeff", "max_grad_norm"}}},
      {"lion", {"lion", {"lr", "betas", "weight_decay", "max_grad_norm"}}},
      {"sgd", {"sgd", {"lr", "momentum", "dampening", "weight_decay", "nesterov", "max_grad_norm"}}},
  };
  return types;
}

/// The translated optimizer.lr, or 1e-3 (DeepSpeed's FusedAdam's default and ZeroRT's).
Json OptimizerLr(const Translation& t) {
  const Json& lr = Member(Member(t.out, "optimizer"), "lr");
  return lr.is_null() ? Json(1e-3) : lr;
}

/// scheduler.params: every key any type takes; SchedulerTypes() says which type takes which.
const Table& SchedulerParams() {
  // Scalars only: DeepSpeed also takes one value per param group.
  auto lr = [](const char* pointer, std::function<Json(const Translation&)> if_auto, std::string why) -> Handler {
    return [=](const Json& v, const std::string& key, Translation& t) {
      if (v.is_array()) return t.Unsupported(key, "a list is not supported (ZeroRT takes one value for every group); write a number");
      if (IsAuto(v)) t.Note(key, "\"auto\": " + why);
      t.out[Pointer(pointer)] = IsAuto(v) ? if_auto(t) : v;
    };
  };
  static const Table table = {
      {"warmup_min_lr", lr("/scheduler/params/warmup_min_lr", [](const Translation&) { return Json(0); },
                           "0, as Hugging Face's Trainer writes")},
      {"warmup_max_lr", lr("/scheduler/params/warmup_max_lr",
                           [](const Translation& t) { return OptimizerLr(t); },
                           "the optimizer's lr, as Hugging Face's Trainer writes")},
      {"warmup_num_steps", To("/scheduler/params/warmup_num_steps", "the number of warmup steps")},
      {"total_num_steps", To("/scheduler/params/total_num_steps", "the run's total number of optimizer steps")},
      {"warmup_type", To("/scheduler/params/warmup_type", "\"log\" or \"linear\"")},
      {"warmup_min_ratio", To("/scheduler/params/warmup_min_ratio", "the ratio to start the warmup at, e.g. 0")},
      {"cos_min_ratio", To("/scheduler/params/cos_min_ratio", "the ratio to end at, e.g. 0.0001")},
      {"last_batch_iteration", Requires(-1, "ZeroRT resumes the schedule from the checkpoint; remove it")},
  };
  return table;
}
const std::map<std::string, std::pair<std::string, std::set<std::string>>>& SchedulerTypes() {
  static const std::set<std::string> warmup = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                               "warmup_type", "last_batch_iteration"};
  static const std::map<std::string, std::pair<std::string, std::set<std::string>>> types = {
      {"warmuplr", {"WarmupLR", warmup}},
      {"warmupdecaylr", {"WarmupDecayLR", [] { auto k = warmup; k.insert("total_num_steps"); return k; }()}},
      {"warmupcosinelr", {"WarmupCosineLR", {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                                             "cos_min_ratio", "warmup_type", "last_batch_iteration"}}},
  };
  return types;
}

const Table& TopLevel() {
  static const Table table = {
      {"zero_optimization", [](const Json& v, const std::string& key, Translation& t) {
         if (v.is_boolean()) return t.Unsupported(key, "the old true/false form; write {\"stage\": N}");
         Walk(v, key, ZeroOptimization(), t);
       }},
      {"optimizer", Keep()}, {"scheduler", Keep()},
      {"fp16", Section(Fp16())}, {"bf16", Section(Bf16())}, {"data_types", Section(DataTypes())},
      {"bfloat16", Refused("the old name of bf16; write \"bf16\"")},
      {"gradient_clipping", Keep()}, {"gradient_accumulation_steps", Keep()},
      {"train_batch_size", Keep()}, {"train_micro_batch_size_per_gpu", Keep()},
      {"communication_data_type", Keep()},
      {"prescale_gradients", Requires(false, "ZeroRT sums gradients and divides by the world size at the step; remove it")},
      {"gradient_predivide_factor", Requires(1.0, "ZeroRT sums gradients and divides by the world size at the step; remove it")},
      {"gradient_allreduce_op", Requires("mean", "ZeroRT averages gradients over the ranks; remove it")},
      {"sparse_gradients", Requires(false, "ZeroRT reduces dense gradients only; remove it")},
      {"amp", Disabled("Apex AMP is not supported; use \"bf16\" or \"fp16\" instead")},
      {"torch_autocast", Disabled("ZeroRT does not run the forward pass; use torch.autocast in the trainer and remove it")},
      {"elasticity", Disabled("elastic training is not supported; remove it")},
      {"steps_per_print", Ignored("ZeroRT prints no progress; Step() returns the step's StepInfo")},
      {"wall_clock_breakdown", Ignored("ZeroRT does not time the trainer's phases")},
      {"memory_breakdown", Ignored("MemoryStats() reports ZeroRT's memory per category")},
      {"dump_state", Ignored("it prints DeepSpeed's engine state")},
      {"tensorboard", Ignored("monitoring is the trainer's; ZeroRT reports StepInfo and MemoryStats()")},
      {"wandb", Ignored("monitoring is the trainer's; ZeroRT reports StepInfo and MemoryStats()")},
      {"csv_monitor", Ignored("monitoring is the trainer's; ZeroRT reports StepInfo and MemoryStats()")},
      {"comet", Ignored("monitoring is the trainer's; ZeroRT reports StepInfo and MemoryStats()")},
      {"comms_logger", Ignored("ZeroRT does not log its collectives")},
      {"flops_profiler", Ignored("ZeroRT does not run the model")},
      {"activation_checkpointing", Ignored("ZeroRT does not run the model; checkpoint activations in the model code")},
      {"zero_allow_untested_optimizer", Ignored("ZeroRT steps only its own optimizers")},
      {"zero_force_ds_cpu_optimizer", Ignored("it concerns CPU offload, which ZeroRT does not do")},
      {"checkpoint", Ignored("ZeroRT checkpoints are written atomically and load at any world size and stage")},
      {"dataloader_drop_last", Ignored("data loading is the trainer's")},
      // ZeroRT's own keys that DeepSpeed lacks (a front door may add them): merged by Finish().
      {"device", Keep()}, {"guard", Keep()}, {"buckets", Keep()}, {"stage3", Keep()},
  };
  return table;
}

/// Top-level keys that ZeroRT's own config has too: they do not make a config DeepSpeed's.
const std::set<std::string>& SharedKeys() {
  static const std::set<std::string> keys = {"optimizer", "scheduler", "gradient_accumulation_steps",
                                             "checkpoint", "device", "guard", "buckets", "stage3"};
  return keys;
}

// ---------------------------------------------------------------------------------------------
// Finish(): the keys that combine.

/// The kept boolean at `key`, `fallback` when absent.
bool Flag(Translation& t, const std::string& key, bool fallback) {
  const Json& v = t.Given(key);
  if (v.is_null()) return fallback;
  if (v.is_boolean()) return v.get<bool>();
  if (IsAuto(v)) AutoUnsupported(t, key, "true or false");
  else t.Unsupported(key, Quoted(v) + " is not true or false");
  return fallback;
}

/// The kept dtype at `key` as "fp32", "bf16" or "fp16" (DeepSpeed's spellings of each, as its
/// DtypeEnum takes them), or `fallback` when absent.
std::string DType(Translation& t, const std::string& key, const std::string& fallback) {
  static const std::map<std::string, std::string> names = {
      {"fp32", "fp32"}, {"float32", "fp32"}, {"float", "fp32"}, {"torch.float32", "fp32"},
      {"bf16", "bf16"}, {"bfloat16", "bf16"}, {"torch.bfloat16", "bf16"},
      {"fp16", "fp16"}, {"float16", "fp16"}, {"half", "fp16"}, {"torch.float16", "fp16"}};
  const Json& v = t.Given(key);
  if (v.is_null()) return fallback;
  auto it = v.is_string() ? names.find(absl::AsciiStrToLower(v.get<std::string>())) : names.end();
  if (it != names.end()) return it->second;
  t.Unsupported(key, Quoted(v) + " is not a dtype; write \"fp32\", \"bf16\" or \"fp16\"");
  return fallback;
}

void FinishOptimizer(Translation& t) {
  const Json& optimizer = t.Given("optimizer");
  if (optimizer.is_null()) {
    t.Note("optimizer", "not given: DeepSpeed then steps the trainer's optimizer; ZeroRT steps its default adamw");
    return;
  }
  if (!optimizer.is_object()) return t.Unsupported("optimizer", Quoted(optimizer) + " is not an object");
  const std::string name = StringMember(optimizer, "type");
  auto type = OptimizerTypes().find(absl::AsciiStrToLower(name));
  if (type == OptimizerTypes().end()) {
    return t.Unsupported("optimizer.type", (name.empty() ? "missing" : "\"" + name + "\" is not supported") +
                                               "; write Adam, AdamW, Lamb, Lion or SGD");
  }
  for (auto it = optimizer.begin(); it != optimizer.end(); ++it) {
    if (it.key() == "params") Walk(*it, "optimizer.params", OptimizerParams(), t, &type->second.keys, name);
    else if (it.key() == "legacy_fusion") t.Note("optimizer.legacy_fusion", "ignored; ZeroRT has one fused kernel per optimizer");
    else if (it.key() != "type") t.Unsupported("optimizer." + it.key(), "not a DeepSpeed key that ZeroRT supports; remove it");
  }
  // engine.py: "Adam" is AdamW unless params say adam_w_mode false; "AdamW" is always AdamW.
  std::string zero_type = type->second.zero_type;
  if (type->first == "adam") {
    zero_type = Flag(t, "optimizer.params.adam_w_mode", true) ? "adamw" : "adam";
    t.Note("optimizer.type", "DeepSpeed's \"" + name + "\" is " + (zero_type == "adamw"
        ? "AdamW (adam_w_mode defaults to true): ZeroRT steps adamw" : "Adam with L2 decay: ZeroRT steps adam"));
  }
  if (type->first == "lamb") {
    t.Note("optimizer.type", "DeepSpeed's Lamb clamps the trust ratio to [0.01, 10]; ZeroRT's lamb (as NVIDIA's FusedLAMB) does not");
  }
  t.out["optimizer"]["type"] = zero_type;
  // torch_adam: torch.optim.AdamW, whose weight decay defaults to 0.01; DeepSpeed's own kernels'
  // (and torch.optim.Adam's) default to 0.
  const bool torch_adamw = Flag(t, "optimizer.params.torch_adam", false) && zero_type == "adamw";
  if (!t.out["optimizer"].contains("weight_decay")) t.out["optimizer"]["weight_decay"] = torch_adamw ? 0.01 : 0.0;
}

void FinishScheduler(Translation& t) {
  const Json& scheduler = t.Given("scheduler");
  if (scheduler.is_null()) return;
  if (!scheduler.is_object()) return t.Unsupported("scheduler", Quoted(scheduler) + " is not an object");
  const std::string name = StringMember(scheduler, "type");
  auto type = SchedulerTypes().find(absl::AsciiStrToLower(name));
  if (type == SchedulerTypes().end()) {
    return t.Unsupported("scheduler.type", (name.empty() ? "missing" : "\"" + name + "\" is not supported") +
        "; write WarmupLR, WarmupDecayLR or WarmupCosineLR, or set the lr from the trainer");
  }
  t.out["scheduler"]["type"] = type->second.first;
  for (auto it = scheduler.begin(); it != scheduler.end(); ++it) {
    if (it.key() == "params") Walk(*it, "scheduler.params", SchedulerParams(), t, &type->second.second, name);
    else if (it.key() != "type") t.Unsupported("scheduler." + it.key(), "not a DeepSpeed key that ZeroRT supports; remove it");
  }
}

void FinishPrecision(Translation& t) {
  const bool fp16 = Flag(t, "fp16.enabled", false), bf16 = Flag(t, "bf16.enabled", false);
  if (fp16 && bf16) t.Unsupported("bf16.enabled", "fp16.enabled is true too (DeepSpeed refuses both as well); enable one");
  const std::string model = bf16 ? "bf16" : fp16 ? "fp16" : "fp32";
  if (DType(t, "data_types.param_dtype", model) != model) {
    t.Unsupported("data_types.param_dtype", "differs from the enabled mode (" + model + "); remove it");
  }
  // engine.py get_data_types(): without grad_accum_dtype, gradients accumulate in the model's
  // dtype (bf16 with bf16, fp16 with fp16); ZeroRT's precision.grad has the same default.
  const std::string grad = DType(t, "data_types.grad_accum_dtype", model);
  if (grad != model && grad != "fp32") {
    t.Unsupported("data_types.grad_accum_dtype", "\"" + grad + "\" is not supported with " + model +
                                                     " params; write \"" + model + "\" or \"fp32\"");
  }
  // engine.py communication_data_type: the model's dtype unless set. ZeroRT reduces in the
  // gradient dtype.
  const std::string reduce = DType(t, "communication_data_type", grad);
  if (reduce != grad) {
    t.Unsupported("communication_data_type", "ZeroRT reduces in the gradient accumulation dtype (" + grad +
                                                 "); remove it or write \"" + grad + "\"");
  } else if (t.Given("communication_data_type").is_null() && grad != model) {
    t.Note("communication_data_type", "not given: DeepSpeed reduces in " + model + ", ZeroRT in " + grad);
  }
  t.out["precision"] = {{"param", model}, {"grad", grad}, {"reduce", grad}};

  if (fp16 && !bf16) {
    const Json& scale = t.Given("fp16.loss_scale");  // DeepSpeed's default 0: dynamic
    if (scale.is_null() || (scale.is_number() && scale.get<double>() == 0)) {
      t.out["loss_scale"]["mode"] = "dynamic";
      static const std::pair<const char*, const char*> kDynamic[] = {
          {"initial_scale_power", "initial_power"}, {"loss_scale_window", "window"},
          {"hysteresis", "hysteresis"}, {"min_loss_scale", "min"}};
      for (auto [key, zero_key] : kDynamic) {
        const Json& v = t.Given(std::string("fp16.") + key);
        if (!v.is_null()) Put(t, std::string("fp16.") + key, v, std::string("/loss_scale/") + zero_key, "a number");
      }
    } else {
      // ZeroRT's static scale is 2^initial_power, initial_power in [0, 64].
      const double value = scale.is_number() ? scale.get<double>() : -1;
      const int power = value > 0 ? std::ilogb(value) : -1;
      if (power < 0 || power > 64 || std::ldexp(1.0, power) != value) {
        t.Unsupported("fp16.loss_scale", Quoted(scale) + " is not supported; write 0 (dynamic) or a power of two from 1 to 2^64");
      } else {
        t.out["loss_scale"] = {{"mode", "static"}, {"initial_power", power}};
      }
    }
  } else if (bf16 && Flag(t, "bf16.check_grad_overflow", true)) {
    // precision_config.py: check_grad_overflow defaults to true (since v0.19.3): a step with an
    // Inf/NaN gradient is skipped. ZeroRT's static scale 2^0 = 1 does the same.
    t.out["loss_scale"] = {{"mode", "static"}, {"initial_power", 0}};
    t.Note("bf16.check_grad_overflow", "true (DeepSpeed's default): steps with Inf/NaN gradients are skipped "
           "(loss_scale {\"mode\": \"static\", \"initial_power\": 0})");
  }
}

/// The kept batch value at `key`: a whole number ≥ 1, or 0 when absent, "auto" or invalid.
int64_t BatchValue(Translation& t, const std::string& key) {
  const Json& v = t.Given(key);
  if (v.is_null() || IsAuto(v)) return 0;
  if (v.is_number() && v.get<double>() >= 1 && v.get<double>() <= 1e15 && v.get<double>() == std::floor(v.get<double>())) {
    return static_cast<int64_t>(v.get<double>());
  }
  t.Unsupported(key, Quoted(v) + " is not a whole number ≥ 1");
  return 0;
}

// config.py _set_batch_related_parameters: train_batch_size = micro × accumulation × world size;
// DeepSpeed derives a missing one with the world size, which is not known here.
void FinishBatch(Translation& t) {
  const int64_t train = BatchValue(t, "train_batch_size"), micro = BatchValue(t, "train_micro_batch_size_per_gpu");
  int64_t accumulation = BatchValue(t, "gradient_accumulation_steps");
  for (const char* key : {"train_batch_size", "train_micro_batch_size_per_gpu"}) {
    if (IsAuto(t.Given(key))) t.Note(key, "\"auto\": left out (Hugging Face's Trainer fills it in; ZeroRT's engine does not need it)");
  }
  if (train > 0 && micro > 0 && train % micro != 0) {
    t.Unsupported("train_batch_size", absl::StrCat(train, " is not a multiple of train_micro_batch_size_per_gpu (", micro, ")"));
  } else if (accumulation == 0 && train > 0 && train == micro) {
    accumulation = 1;  // train = micro × accumulation × world: both are 1
  } else if (IsAuto(t.Given("gradient_accumulation_steps"))) {
    AutoUnsupported(t, "gradient_accumulation_steps", "the number of micro-batches per optimizer step");
  } else if (accumulation == 0 && train > 0 && micro > 0) {
    t.Note("gradient_accumulation_steps", "not given: DeepSpeed derives it with the world size; ZeroRT uses 1 "
           "and the engine checks train_batch_size = micro batch × world size");
  }
  if (train > 0) t.out["batch"]["train_batch_size"] = train;
  if (micro > 0) t.out["batch"]["micro_batch_size_per_rank"] = micro;
  if (accumulation > 0) t.out["gradient_accumulation_steps"] = accumulation;
}

void FinishClipping(Translation& t) {
  const Json& clip = t.Given("gradient_clipping");
  if (!clip.is_null()) {
    return Put(t, "gradient_clipping", clip, "/clip_grad_norm", "the max norm, e.g. 1.0 (Hugging Face's max_grad_norm), or 0");
  }
  // constants.py GRADIENT_CLIPPING_DEFAULT: 1.0 since v0.19.3 (0, no clipping, before).
  t.out["clip_grad_norm"] = 1.0;
  t.Note("gradient_clipping", "not given: clipping at 1.0, DeepSpeed's default since v0.19.3; write 0 to disable");
}

/// ZeroRT's own keys, merged into the translation; one set both ways is unsupported.
void FinishOwnKeys(Translation& t) {
  for (const char* section : {"device", "guard", "buckets", "stage3"}) {
    const Json& own = t.Given(section);
    if (own.is_null()) continue;
    if (!own.is_object()) {
      t.out[section] = own;
      continue;
    }
    Json& merged = t.out[section];
    for (auto it = own.begin(); it != own.end(); ++it) {
      if (merged.contains(it.key()) && merged[it.key()] != *it) {
        t.Unsupported(std::string(section) + "." + it.key(), "also set by its DeepSpeed key; keep one of them");
      }
      merged[it.key()] = *it;
    }
  }
}

}  // namespace

bool IsDeepSpeedConfig(const nlohmann::json& config) {
  if (!config.is_object()) return false;
  for (auto it = config.begin(); it != config.end(); ++it) {
    if (TopLevel().count(it.key()) != 0 && SharedKeys().count(it.key()) == 0) return true;
  }
  // DeepSpeed's optimizer section nests its hyperparameters under "params"; ZeroRT's does not.
  auto optimizer = config.find("optimizer");
  return optimizer != config.end() && optimizer->is_object() && optimizer->contains("params");
}

StatusOr<nlohmann::json> TranslateDeepSpeedConfig(const nlohmann::json& config,
                                                  std::vector<std::string>* notes) {
  Translation t;
  t.out["stage"] = 0;  // zero_optimization.stage defaults to 0 (zero/config.py)
  Walk(config, "", TopLevel(), t);
  FinishOptimizer(t);
  FinishScheduler(t);
  FinishPrecision(t);
  FinishBatch(t);
  FinishClipping(t);
  FinishOwnKeys(t);
  if (!t.unsupported.empty()) {
    const size_t n = t.unsupported.size();
    return absl::InvalidArgumentError(absl::StrCat("DeepSpeed config: ", n, n == 1 ? " key is" : " keys are",
                                                   " not supported:\n", absl::StrJoin(t.unsupported, "\n")));
  }
  if (notes != nullptr) notes->insert(notes->end(), t.notes.begin(), t.notes.end());
  return std::move(t.out);
}

}  // namespace zero::runtime
