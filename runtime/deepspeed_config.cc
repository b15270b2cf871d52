// DeepSpeed's JSON config translated into ZeroRT's. Each DeepSpeed section is a table of
// key → handler. A handler writes its ZeroRT key, notes a key that only tunes DeepSpeed, names
// an unsupported key with what to do, or keeps the value for the Finish* functions, which
// combine keys that meet in one ZeroRT key (fp16 + bf16 + data_types → precision and
// loss_scale; the three batch keys; optimizer type + params).
//
// Where DeepSpeed's default changes the numbers (ZeRO stage, weight decay, clipping, gradient
// dtype, skipped steps) the translation writes it; where it only changes speed (bucket sizes,
// overlap_comm) ZeroRT's default stays. DeepSpeed's facts are from deepspeedai/DeepSpeed
// v0.19.6: deepspeed/runtime/{config,constants,engine,precision_config,lr_schedules}.py,
// deepspeed/runtime/zero/config.py and the optimizers in deepspeed/ops/.
#include "runtime/deepspeed_config.h"

#include <algorithm>
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

/// The translation under way.
struct Translation {
  Json out = Json::object();             ///< the ZeroRT config
  std::vector<std::string> notes;        ///< "key: text"
  std::vector<std::string> unsupported;  ///< "key: what to do"
  std::map<std::string, Json> given;     ///< values kept for the Finish* functions, by dotted key
  KeyOrigins origins;                    ///< ZeroRT key -> the DeepSpeed key its value came from

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

/// Handles the value at dotted key `key` (e.g. "zero_optimization.stage").
using Handler = std::function<void(const Json& value, const std::string& key, Translation& t)>;
using Table = std::map<std::string, Handler>;

bool IsAuto(const Json& v) { return v.is_string() && v.get<std::string>() == "auto"; }
/// `v` as JSON for a message, shortened to about 40 characters.
std::string Quoted(const Json& v) {
  const std::string text = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  return text.size() <= 40 ? text : text.substr(0, 40) + "…";
}
/// `object[key]`, or null when `object` is not an object or lacks `key`.
const Json& Member(const Json& object, const std::string& key) {
  static const Json kNull;
  auto it = object.is_object() ? object.find(key) : object.end();
  return it == object.end() ? kNull : *it;
}
/// ZeroRT's dotted key `dotted` ("buckets.overlap") as a JSON pointer into the output.
Json::json_pointer At(std::string dotted) {
  for (char& c : dotted) c = c == '.' ? '/' : c;
  return Json::json_pointer("/" + dotted);
}

/// "auto" is Hugging Face's Trainer's: it fills the value in before DeepSpeed reads the config.
void AutoUnsupported(Translation& t, const std::string& key, const std::string& what) {
  t.Unsupported(key, "\"auto\" is filled in by Hugging Face's Trainer, which is not here; write " + what);
}
/// Writes `v` at ZeroRT's key `zero_key` (ZeroRT's parser checks its type and range); "auto"
/// is unsupported, with `what` to write instead.
void Put(Translation& t, const std::string& key, const Json& v, const std::string& zero_key,
         const std::string& what) {
  if (IsAuto(v)) return AutoUnsupported(t, key, what);
  t.out[At(zero_key)] = v;
  t.origins[zero_key] = key;
}

// ---------------------------------------------------------------------------------------------
// Handler factories.

/// Copied to ZeroRT's `zero_key`.
Handler To(std::string zero_key, std::string what) {
  return [=](const Json& v, const std::string& key, Translation& t) { Put(t, key, v, zero_key, what); };
}
/// A size that only tunes speed: copied to `zero_key`; with "auto" (which Hugging Face derives
/// from the model's hidden size) ZeroRT's default stays.
Handler Tuning(std::string zero_key) {
  return [=](const Json& v, const std::string& key, Translation& t) {
    if (!IsAuto(v)) {
      t.out[At(zero_key)] = v;
      t.origins[zero_key] = key;
      return;
    }
    t.Note(key, "\"auto\" (Hugging Face derives it from the model's hidden size): ZeroRT's default " +
                    zero_key + " is used");
  };
}
/// Kept for the Finish* functions.
Handler Keep() {
  return [](const Json& v, const std::string& key, Translation& t) { t.given[key] = v; };
}
/// Accepted and ignored, with a note saying `why`.
Handler Ignored(std::string why) {
  return [=](const Json&, const std::string& key, Translation& t) { t.Note(key, "ignored; " + why); };
}
/// Accepted when null or `accepted` (DeepSpeed's default); any other value is unsupported.
Handler Requires(Json accepted, std::string otherwise) {
  return [=](const Json& v, const std::string& key, Translation& t) {
    if (!v.is_null() && v != accepted) t.Unsupported(key, Quoted(v) + " is not supported; " + otherwise);
  };
}
/// A section accepted only when its member `member` is null or `accepted` (e.g. "enabled":
/// false, or an offload section's "device": "none").
Handler RequiresMember(std::string member, Json accepted, std::string otherwise) {
  return [=](const Json& v, const std::string& key, Translation& t) {
    const Json& m = Member(v, member);
    if (!v.is_null() && (!v.is_object() || !(m.is_null() || m == accepted))) t.Unsupported(key, otherwise);
  };
}

/// The number of single-character edits (insert, delete, replace) from `a` to `b`.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// "; did you mean \"K\"?" for the key of `table` nearest to `key` (a misspelling: at most
/// 2 edits, and fewer than a third of its length), or "".
std::string NearestKey(const std::string& key, const Table& table) {
  std::string nearest;
  size_t best = std::min<size_t>(3, (key.size() + 2) / 3);
  for (const auto& [name, unused] : table) {
    const size_t distance = EditDistance(key, name);
    if (distance < best) {
      best = distance;
      nearest = name;
    }
  }
  return nearest.empty() ? "" : "; did you mean \"" + nearest + "\"?";
}

/// Where a key of ZeroRT's own config, found in a config read as DeepSpeed's (the two mixed),
/// goes in DeepSpeed's form; "" for any other key.
std::string ZeroRtKeyInDeepSpeedForm(const std::string& key) {
  static const std::map<std::string, std::string> kForms = {
      {"stage", "zero_optimization.stage"},
      {"precision", "bf16.enabled, fp16.enabled and data_types.grad_accum_dtype"},
      {"buckets", "zero_optimization.reduce_bucket_size and allgather_bucket_size"},
      {"stage3", "zero_optimization.stage3_* (stage3_prefetch_bucket_size, stage3_param_persistence_threshold, ...)"},
      {"clip_grad_norm", "gradient_clipping"},
      {"loss_scale", "fp16.loss_scale, initial_scale_power, loss_scale_window, min_loss_scale"},
      {"batch", "train_batch_size and train_micro_batch_size_per_gpu"}};
  const auto form = kForms.find(key);
  if (form == kForms.end()) return "";
  return "ZeroRT's own key in a config read as DeepSpeed's (it has DeepSpeed's keys): write it as " + form->second +
         ", or give ZeroRT's keys alone (removing it would drop its value)";
}

/// Walks `object`'s keys through `table`. A key outside the table, or outside `allowed` when
/// given (the keys that `owner`, e.g. "Lion", takes), is unsupported.
void Walk(const Json& object, const std::string& prefix, const Table& table, Translation& t,
          const std::set<std::string>* allowed = nullptr, const std::string& owner = "") {
  if (!object.is_object()) {
    return t.Unsupported(prefix.empty() ? "(top level)" : prefix, Quoted(object) + " is not an object");
  }
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    auto handler = table.find(it.key());
    const std::string zerort_form = prefix.empty() ? ZeroRtKeyInDeepSpeedForm(it.key()) : "";
    if (handler == table.end() && !zerort_form.empty()) {
      t.Unsupported(key, zerort_form);
    } else if (handler == table.end()) {
      t.Unsupported(key, "not a DeepSpeed key that ZeroRT supports; remove it" + NearestKey(it.key(), table));
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

/// A section with a "type" and "params": lowercase type → ZeroRT's name and the params it takes.
using Types = std::map<std::string, std::pair<std::string, std::set<std::string>>>;

/// optimizer.params, for every type (OptimizerTypes() says which type takes which key).
const Table& OptimizerParams() {
  static const Table table = {
      {"lr", To("optimizer.lr", "the learning rate, e.g. 1e-4")},
      {"betas", To("optimizer.betas", "[beta1, beta2], e.g. [0.9, 0.999]")},
      {"eps", To("optimizer.eps", "epsilon, e.g. 1e-8")},
      {"weight_decay", To("optimizer.weight_decay", "the weight decay, e.g. 0.01")},
      {"momentum", To("optimizer.momentum", "the momentum, e.g. 0.9")},
      {"dampening", To("optimizer.dampening", "the dampening, e.g. 0")},
      {"nesterov", To("optimizer.nesterov", "true or false")},
      {"adam_w_mode", Keep()}, {"torch_adam", Keep()},
      {"bias_correction", Requires(true, "ZeroRT's Adam, AdamW and LAMB always correct the bias; remove it")},
      {"amsgrad", Requires(false, "AMSGrad is not supported (DeepSpeed's FusedAdam refuses it too); remove it")},
      {"eps_inside_sqrt", Requires(false, "ZeroRT's LAMB adds eps outside the square root; remove it")},
      {"max_coeff", Requires(nullptr, "ZeroRT's LAMB does not clamp the trust ratio; remove it")},
      {"min_coeff", Requires(nullptr, "ZeroRT's LAMB does not clamp the trust ratio; remove it")},
      {"max_grad_norm", Requires(nullptr, "write the top-level gradient_clipping instead (as DeepSpeed says)")},
  };
  return table;
}
/// engine.py _configure_basic_optimizer: Adam and AdamW are FusedAdam, Lamb FusedLamb, Lion
/// FusedLion, other names torch.optim's (of which ZeroRT has SGD).
const Types& OptimizerTypes() {
  static const std::set<std::string> adam = {"lr", "betas", "eps", "weight_decay", "adam_w_mode",
                                             "torch_adam", "bias_correction", "amsgrad", "max_grad_norm"};
  static const Types types = {
      {"adam", {"adamw", adam}}, {"adamw", {"adamw", adam}},  // FinishOptimizer() tells Adam from AdamW
      {"lamb", {"lamb", {"lr", "betas", "eps", "weight_decay", "bias_correction", "amsgrad",
                         "eps_inside_sqrt", "max_coeff", "min_coeff", "max_grad_norm"}}},
      {"lion", {"lion", {"lr", "betas", "weight_decay", "max_grad_norm"}}},
      {"sgd", {"sgd", {"lr", "momentum", "dampening", "weight_decay", "nesterov", "max_grad_norm"}}},
  };
  return types;
}

/// scheduler.params, for every type (SchedulerTypes() says which type takes which key). Its keys
/// are ZeroRT's too.
const Table& SchedulerParams() {
  // warmup_min_lr, warmup_max_lr: one number for every group (DeepSpeed also takes a list).
  // "auto" is what Hugging Face's Trainer writes: 0, and the optimizer's lr (its learning_rate).
  const Handler lr = [](const Json& v, const std::string& key, Translation& t) {
    if (v.is_array()) return t.Unsupported(key, "a list is not supported (one value for all groups); write a number");
    Json value = v;
    if (IsAuto(v)) {
      const Json& optimizer_lr = Member(Member(t.out, "optimizer"), "lr");  // FusedAdam's default: 1e-3
      value = key.find("max") == std::string::npos ? Json(0) : optimizer_lr.is_null() ? Json(1e-3) : optimizer_lr;
      t.Note(key, "\"auto\": " + value.dump() + ", as Hugging Face's Trainer writes");
    }
    t.out[At(key)] = value;
  };
  static const Table table = {
      {"warmup_min_lr", lr}, {"warmup_max_lr", lr},
      {"warmup_num_steps", To("scheduler.params.warmup_num_steps", "the number of warmup steps")},
      {"total_num_steps", To("scheduler.params.total_num_steps", "the run's total number of optimizer steps")},
      {"warmup_type", To("scheduler.params.warmup_type", "\"log\" or \"linear\"")},
      {"warmup_min_ratio", To("scheduler.params.warmup_min_ratio", "the ratio to start the warmup at, e.g. 0")},
      {"cos_min_ratio", To("scheduler.params.cos_min_ratio", "the ratio to end at, e.g. 0.0001")},
      {"last_batch_iteration", Requires(-1, "ZeroRT resumes the schedule from the checkpoint; remove it")},
  };
  return table;
}
/// lr_schedules.py: the constructors' arguments (OneCycle and LRRangeTest ZeroRT lacks).
const Types& SchedulerTypes() {
  static const Types types = {
      {"warmuplr", {"WarmupLR", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                 "last_batch_iteration"}}},
      {"warmupdecaylr", {"WarmupDecayLR", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                           "last_batch_iteration", "total_num_steps"}}},
      {"warmupcosinelr", {"WarmupCosineLR", {"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                                             "cos_min_ratio", "warmup_type", "last_batch_iteration"}}},
  };
  return types;
}

/// Whether the translation has set guard.on_unused already.
bool SetsOnUnused(const Translation& t) {
  const auto guard = t.out.find("guard");
  return guard != t.out.end() && guard->contains("on_unused");
}

/// The top-level keys, and the sections that are walked as they come.
const Table& TopLevel() {
  static const std::string states =
      "not supported yet; remove it (ZeroRT keeps optimizer states on the engine's device)";
  static const std::string params = "not supported yet; remove it (ZeroRT keeps params on the engine's device)";
  static const std::string masters = "ZeroRT checkpoints hold the full fp32 master; zero-ckpt consolidates them";
  static const std::string leaf =
      "it chooses the modules whose subtrees are stage-3 units; zerort.torch reads it from the config it is "
      "given, the engine itself takes units as the trainer registers them";
  static const Table zero = {
      {"stage", To("stage", "the ZeRO stage, 0 to 3")},
      {"reduce_bucket_size", Tuning("buckets.reduce_bucket_elems")},
      {"overlap_comm", To("buckets.overlap", "true or false")},
      {"stage3_prefetch_bucket_size", Tuning("stage3.prefetch_elems")},
      {"stage3_max_live_parameters", Tuning("stage3.max_live_elems")},
      {"stage3_param_persistence_threshold", Tuning("stage3.persistence_threshold")},
      {"ignore_unused_parameters", [](const Json& v, const std::string& key, Translation& t) {
         if (!v.is_boolean()) return t.Unsupported(key, Quoted(v) + " is not true or false");
         if (SetsOnUnused(t)) return t.Unsupported(key, "guard.on_unused says it too; keep one of them");
         t.out["guard"]["on_unused"] = v.get<bool>() ? "zero" : "error";
       }},
      {"offload_optimizer", RequiresMember("device", "none", states)}, {"cpu_offload", Requires(false, states)},
      {"offload_param", RequiresMember("device", "none", params)}, {"cpu_offload_param", Requires(false, params)},
      {"round_robin_gradients", Ignored("it speeds up copies for CPU offload, which ZeroRT does not do")},
      {"sub_group_size", Ignored("it tiles the step for offload; ZeroRT steps each rank's shard segments whole")},
      {"contiguous_gradients", Ignored("ZeroRT's gradients always live in contiguous flat bucket buffers")},
      {"allgather_bucket_size", Ignored("ZeroRT all-gathers whole buckets (stage 3: whole units)")},
      {"allgather_partitions", Ignored("ZeroRT always all-gathers the updated shards")},
      {"reduce_scatter", Ignored("ZeroRT reduce-scatters each bucket into the shards (all-reduce at stage 0)")},
      {"stage3_max_reuse_distance", Tuning("stage3.max_reuse_elems")},
      {"leaf_module", Ignored(leaf)}, {"stage3_module_granularity_threshold", Ignored(leaf)},
      {"stage3_gather_16bit_weights_on_model_save", Ignored(masters)},
      {"stage3_gather_fp16_weights_on_model_save", Ignored(masters)},  // its older name
      {"elastic_checkpoint", Ignored("ZeroRT checkpoints load at any world size")},
      {"load_from_fp32_weights", Ignored("ZeroRT checkpoints always restore the fp32 master")},
  };
  static const Table fp16 = {
      {"enabled", Keep()}, {"loss_scale", Keep()}, {"initial_scale_power", Keep()},
      {"loss_scale_window", Keep()}, {"hysteresis", Keep()}, {"min_loss_scale", Keep()},
      {"consecutive_hysteresis",
       Requires(false, "ZeroRT refills the hysteresis only when the scale grows (DeepSpeed's default); remove it")},
      {"auto_cast", Requires(false, "ZeroRT does not see the model's inputs; cast them in the trainer, remove it")},
      {"fp16_master_weights_and_grads", Requires(false, "ZeroRT keeps an fp32 master copy; remove it")},
  };
  static const Table bf16 = {
      {"enabled", Keep()}, {"check_grad_overflow", Keep()},
      {"immediate_grad_update", Ignored("ZeroRT adds each gradient into its bucket as it arrives")},
      {"bf16_master_weights_and_grads", Requires(false, "ZeroRT keeps an fp32 master copy; remove it")},
      {"bf16_optimizer_states", Requires(false, "ZeroRT keeps optimizer states in fp32; remove it")},
  };
  static const Table data_types = {
      {"grad_accum_dtype", Keep()}, {"param_dtype", Keep()},
      {"buffer_dtype", Requires(nullptr, "ZeroRT does not own the model's buffers; cast them in the trainer")},
  };
  static const std::string monitor = "monitoring is the trainer's; ZeroRT reports StepInfo and MemoryStats()";
  static const std::string postscale = "ZeroRT sums gradients, then divides by the world size; remove it";
  static const Table table = {
      {"zero_optimization", [](const Json& v, const std::string& key, Translation& t) {
         if (v.is_boolean()) return t.Unsupported(key, "the old true/false form; write {\"stage\": N}");
         Walk(v, key, zero, t);
       }},
      {"fp16", Section(fp16)}, {"bf16", Section(bf16)}, {"data_types", Section(data_types)},
      {"optimizer", Keep()}, {"scheduler", Keep()}, {"gradient_clipping", Keep()},
      {"communication_data_type", Keep()}, {"gradient_accumulation_steps", Keep()},
      {"train_batch_size", Keep()}, {"train_micro_batch_size_per_gpu", Keep()},
      {"prescale_gradients", Requires(false, postscale)},
      {"gradient_predivide_factor", Requires(1.0, postscale)},
      {"amp", RequiresMember("enabled", false, "Apex AMP is not supported; remove it and use \"bf16\" or \"fp16\"")},
      {"steps_per_print", Ignored("ZeroRT prints no progress; Step() returns the step's StepInfo")},
      {"wall_clock_breakdown", Ignored("ZeroRT does not time the trainer's phases")},
      {"memory_breakdown", Ignored("ZeroRT reports its memory in MemoryStats(), per category")},
      {"sparse_gradients", Ignored("it sends embedding gradients sparse; ZeroRT reduces them dense, as it would")},
      {"dump_state", Ignored("it prints DeepSpeed's engine state")},
      {"dataloader_drop_last", Ignored("the training data's loader reads it (zerort.torch.deepspeed.initialize)")},
      {"tensorboard", Ignored(monitor)}, {"wandb", Ignored(monitor)}, {"csv_monitor", Ignored(monitor)},
      {"comet", Ignored(monitor)}, {"comms_logger", Ignored(monitor)},
      {"flops_profiler", Ignored("ZeroRT does not run the model")},
      {"activation_checkpointing", Ignored("ZeroRT does not run the model; checkpoint activations in its code")},
      {"zero_allow_untested_optimizer", Ignored("ZeroRT steps only its own optimizers")},
      {"zero_force_ds_cpu_optimizer", Ignored("it concerns CPU offload, which ZeroRT does not do")},
      {"checkpoint", Ignored("ZeroRT checkpoints are written atomically and load at any world size and stage")},
      {"device", To("device", "\"cpu\" or \"cuda\"")},  // ZeroRT's own: DeepSpeed runs on its accelerator
      // ZeroRT's own section (guard.on_duplicate, timeout_s, ...), which no DeepSpeed key sets:
      // taken as it is, and checked with the rest of the translated config.
      {"guard", [](const Json& v, const std::string& key, Translation& t) {
         if (!v.is_object()) return t.Unsupported(key, Quoted(v) + " is not an object");
         if (v.contains("on_unused") && SetsOnUnused(t)) {
           return t.Unsupported("guard.on_unused", "zero_optimization.ignore_unused_parameters says it too; keep one");
         }
         for (auto it = v.begin(); it != v.end(); ++it) t.out["guard"][it.key()] = *it;
         t.Note(key, "ZeroRT's own section, taken as it is");
       }},
  };
  return table;
}

// ---------------------------------------------------------------------------------------------
// The keys that combine.

/// The kept boolean at `key`, `fallback` when absent.
bool Flag(Translation& t, const std::string& key, bool fallback) {
  const Json& v = t.Given(key);
  if (v.is_null() || v.is_boolean()) return v.is_null() ? fallback : v.get<bool>();
  if (IsAuto(v)) AutoUnsupported(t, key, "true or false");
  else t.Unsupported(key, Quoted(v) + " is not true or false");
  return fallback;
}

/// The kept dtype at `key` as "fp32", "bf16" or "fp16" (from any spelling DeepSpeed's DtypeEnum
/// takes), `fallback` when absent.
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

/// The kept section `section` {"type", "params"} with its params walked: its entry in `types`,
/// or null (absent, or unsupported and named). `choices` lists the types for the error.
const Types::value_type* Typed(Translation& t, const std::string& section, const Table& params,
                               const Types& types, const std::string& choices) {
  const Json& value = t.Given(section);
  if (value.is_null()) return nullptr;
  const Json& name = Member(value, "type");
  auto type = name.is_string() ? types.find(absl::AsciiStrToLower(name.get<std::string>())) : types.end();
  if (!value.is_object()) {
    t.Unsupported(section, Quoted(value) + " is not an object");
    return nullptr;
  }
  if (type == types.end()) {
    const std::string what = name.is_null() ? "missing" : Quoted(name) + " is not supported";
    t.Unsupported(section + ".type", what + "; write " + choices);
    return nullptr;
  }
  for (auto it = value.begin(); it != value.end(); ++it) {
    const std::string key = section + "." + it.key();
    if (it.key() == "params") Walk(*it, key, params, t, &type->second.second, name.get<std::string>());
    else if (it.key() != "type" && params.count(it.key()) != 0) {
      t.Unsupported(key, "DeepSpeed takes the optimizer's settings inside its \"params\": write it as " + section +
                             ".params." + it.key());
    } else if (it.key() != "type") {
      t.Unsupported(key, "not a DeepSpeed key that ZeroRT supports; remove it");
    }
  }
  return &*type;
}

void FinishOptimizer(Translation& t) {
  const auto* type = Typed(t, "optimizer", OptimizerParams(), OptimizerTypes(), "Adam, AdamW, Lamb, Lion or SGD");
  if (t.Given("optimizer").is_null()) {
    t.Note("optimizer", "not given: DeepSpeed then steps the trainer's optimizer, ZeroRT its default adamw");
  }
  if (type == nullptr) return;
  // engine.py: "Adam" is AdamW unless params say "adam_w_mode": false; "AdamW" is always AdamW.
  std::string zero_type = type->second.first;
  if (type->first == "adam") {
    zero_type = Flag(t, "optimizer.params.adam_w_mode", true) ? "adamw" : "adam";
    t.Note("optimizer.type", zero_type == "adamw"
                                 ? "DeepSpeed's Adam is AdamW (adam_w_mode defaults to true): ZeroRT steps adamw"
                                 : "DeepSpeed's Adam with adam_w_mode false: ZeroRT steps adam");
  } else if (type->first == "lamb") {
    t.Note("optimizer.type", "DeepSpeed's Lamb clamps the trust ratio to [0.01, 10]; ZeroRT's lamb does not");
  }
  t.out["optimizer"]["type"] = zero_type;
  // Without weight_decay: 0 (FusedAdam, FusedLamb, FusedLion, torch.optim.SGD and Adam), or
  // 0.01 for "torch_adam": true with AdamW (torch.optim.AdamW's default).
  const bool torch_adamw = Flag(t, "optimizer.params.torch_adam", false) && zero_type == "adamw";
  if (!t.out["optimizer"].contains("weight_decay")) t.out["optimizer"]["weight_decay"] = torch_adamw ? 0.01 : 0;
}

void FinishScheduler(Translation& t) {
  const auto* type = Typed(t, "scheduler", SchedulerParams(), SchedulerTypes(),
                           "WarmupLR, WarmupDecayLR or WarmupCosineLR, or set the lr from the trainer");
  if (type != nullptr) t.out["scheduler"]["type"] = type->second.first;
}

void FinishPrecision(Translation& t) {
  const bool fp16 = Flag(t, "fp16.enabled", false), bf16 = Flag(t, "bf16.enabled", false);
  if (fp16 && bf16) t.Unsupported("bf16.enabled", "fp16.enabled is true too (DeepSpeed refuses both); enable one");
  const std::string model = bf16 ? "bf16" : fp16 ? "fp16" : "fp32";
  if (DType(t, "data_types.param_dtype", model) != model) {
    t.Unsupported("data_types.param_dtype", "differs from the enabled mode (" + model + "); remove it");
  }
  // engine.py get_data_types(): without grad_accum_dtype, gradients accumulate in the model's
  // dtype (bf16 with bf16, fp16 with fp16). ZeroRT takes that or fp32.
  const std::string grad = DType(t, "data_types.grad_accum_dtype", model);
  if (grad != model && grad != "fp32") {
    t.Unsupported("data_types.grad_accum_dtype", "\"" + grad + "\" is not supported with " + model +
                                                     " params; write \"" + model + "\" or \"fp32\"");
  }
  // engine.py communication_data_type: the model's dtype unless set; ZeroRT reduces in the
  // gradient dtype.
  if (DType(t, "communication_data_type", grad) != grad) {
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
      const std::map<std::string, std::string> dynamic = {{"initial_scale_power", "initial_power"},
          {"loss_scale_window", "window"}, {"hysteresis", "hysteresis"}, {"min_loss_scale", "min"}};
      for (const auto& [key, zero_key] : dynamic) {
        const Json& v = t.Given("fp16." + key);
        if (!v.is_null()) Put(t, "fp16." + key, v, "loss_scale." + zero_key, "a number");
      }
    } else {  // ZeroRT's static scale is 2^initial_power, initial_power in [0, 64]
      const double value = scale.is_number() ? scale.get<double>() : -1;
      const int power = value > 0 ? std::ilogb(value) : -1;
      if (power < 0 || power > 64 || std::ldexp(1.0, power) != value) {
        t.Unsupported("fp16.loss_scale", Quoted(scale) + " is not supported; write 0 (dynamic) or a power of two "
                                                         "from 1 to 2^64");
      } else {
        t.out["loss_scale"] = {{"mode", "static"}, {"initial_power", power}};
      }
    }
  } else if (bf16 && Flag(t, "bf16.check_grad_overflow", true)) {
    // precision_config.py: check_grad_overflow defaults to true in DeepSpeed's newest releases
    // (false before): a step with an Inf/NaN gradient is skipped, as ZeroRT's static scale 2^0 = 1
    // does.
    t.out["loss_scale"] = {{"mode", "static"}, {"initial_power", 0}};
    t.Note("bf16.check_grad_overflow", "true (the default of DeepSpeed's newest releases): steps with Inf/NaN gradients are skipped "
                                       "(loss_scale {\"mode\": \"static\", \"initial_power\": 0})");
  }
}

/// The kept batch value at `key`: a whole number ≥ 1, or 0 when absent, "auto" or unsupported.
int64_t BatchValue(Translation& t, const std::string& key) {
  const Json& v = t.Given(key);
  if (v.is_null() || IsAuto(v)) return 0;
  const double n = v.is_number() ? v.get<double>() : 0;
  if (n >= 1 && n <= 1e15 && n == std::floor(n)) return static_cast<int64_t>(n);
  t.Unsupported(key, Quoted(v) + " is not a whole number ≥ 1");
  return 0;
}

// config.py _set_batch_related_parameters: train_batch_size = micro batch × accumulation ×
// world size; DeepSpeed derives a missing one with the world size, which is not known here.
void FinishBatch(Translation& t) {
  const int64_t train = BatchValue(t, "train_batch_size");
  const int64_t micro = BatchValue(t, "train_micro_batch_size_per_gpu");
  int64_t accumulation = BatchValue(t, "gradient_accumulation_steps");
  for (const char* key : {"train_batch_size", "train_micro_batch_size_per_gpu"}) {
    if (IsAuto(t.Given(key))) t.Note(key, "\"auto\": left out (Hugging Face's Trainer fills it in; ZeroRT needs none)");
  }
  if (train > 0 && micro > 0 && train % micro != 0) {
    t.Unsupported("train_batch_size",
                  absl::StrCat(train, " is not a multiple of train_micro_batch_size_per_gpu (", micro, ")"));
  } else if (accumulation == 0 && train > 0 && train == micro) {
    accumulation = 1;  // accumulation × world size = 1
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
  if (!clip.is_null()) return Put(t, "gradient_clipping", clip, "clip_grad_norm", "the max norm, e.g. 1.0, or 0");
  // constants.py GRADIENT_CLIPPING_DEFAULT: 1.0 since v0.19.3 (0, no clipping, before).
  t.out["clip_grad_norm"] = 1.0;
  t.Note("gradient_clipping", "not given: clipping at 1.0, DeepSpeed's default since v0.19.3; write 0 to disable");
}

}  // namespace

bool IsDeepSpeedConfig(const nlohmann::json& config) {
  // Top-level keys that ZeroRT's own config has too do not make a config DeepSpeed's.
  static const std::set<std::string> shared = {"optimizer", "scheduler", "gradient_accumulation_steps",
                                               "checkpoint", "device", "guard"};
  if (!config.is_object()) return false;
  for (auto it = config.begin(); it != config.end(); ++it) {
    if (TopLevel().count(it.key()) != 0 && shared.count(it.key()) == 0) return true;
  }
  // DeepSpeed's optimizer nests its hyperparameters under "params"; ZeroRT's does not (both
  // schedulers do).
  if (Member(config, "optimizer").contains("params")) return true;
  // DeepSpeed's checkpoint section has keys ZeroRT's (keep_last, save_frozen) has not.
  for (const char* key : {"tag_validation", "load_universal", "use_node_local_storage", "parallel_write"}) {
    if (Member(config, "checkpoint").contains(key)) return true;
  }
  return false;
}

StatusOr<nlohmann::json> TranslateDeepSpeedConfig(const nlohmann::json& config,
                                                  std::vector<std::string>* notes, KeyOrigins* origins) {
  Translation t;
  t.out["stage"] = 0;  // zero/config.py: stage defaults to 0 (ZeroRT's to 2)
  Walk(config, "", TopLevel(), t);
  FinishOptimizer(t);
  FinishScheduler(t);
  FinishPrecision(t);
  FinishBatch(t);
  FinishClipping(t);
  if (!t.unsupported.empty()) {
    const size_t n = t.unsupported.size();
    return absl::InvalidArgumentError(absl::StrCat("DeepSpeed config: ", n, n == 1 ? " key is" : " keys are",
                                                   " not supported:\n", absl::StrJoin(t.unsupported, "\n")));
  }
  if (notes != nullptr) notes->insert(notes->end(), t.notes.begin(), t.notes.end());
  if (origins != nullptr) *origins = std::move(t.origins);
  return std::move(t.out);
}

std::string NameDeepSpeedKeys(const std::string& message, const KeyOrigins& origins) {
  static const std::string kKey = "config key \"";
  std::string out;
  size_t at = 0;
  for (size_t found; (found = message.find(kKey, at)) != std::string::npos;) {
    const size_t begin = found + kKey.size(), end = message.find('"', begin);
    if (end == std::string::npos) break;
    const std::string key = message.substr(begin, end - begin);
    const size_t index = std::min(key.find('['), key.size());  // "optimizer.betas[1]"
    const auto origin = origins.find(key.substr(0, index));
    out += message.substr(at, found - at);
    out += origin == origins.end() || origin->second == key.substr(0, index)
               ? message.substr(found, end + 1 - found)
               : absl::StrCat("DeepSpeed key \"", origin->second, key.substr(index), "\" (ZeroRT's \"", key, "\")");
    at = end + 1;
  }
  return out + message.substr(at);
}

}  // namespace zero::runtime
