// Config from JSON (nlohmann/json), with errors that name the key, quote the value as written
// and say what is allowed.
#include "zero/config.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/deepspeed_config.h"
#include "zero/engine.h"

namespace zero {
namespace {

using Json = nlohmann::json;

Status KeyError(absl::string_view key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config key \"", key, "\": ", what));
}

// ---------------------------------------------------------------------------------------------
// What each numeric key allows. FromJson checks the value as written, Validate the stored one;
// both use these. Every range is finite (NaN and ±Inf are never in one), and the kernels'
// argument checks (kernels/launch_checks.cc) accept everything inside them.

// [min, max], either end open; `allowed` says it in messages.
struct Range {
  double min, max;
  bool min_open, max_open;
  const char* allowed;

  bool Contains(double v) const {
    return (min_open ? v > min : v >= min) && (max_open ? v < max : v <= max);
  }
};

constexpr double kIntMax = std::numeric_limits<int>::max();
// Element counts: exact in a double (so a JSON integer is never rounded into range), and
// far above any model (petabytes).
constexpr double kMaxElems = 1e15;

const Range kStage{0, 3, false, false, "0, 1, 2 or 3"};
const Range kLr{0, 1e6, false, false, "≥ 0 and ≤ 1e6"};
const Range kBeta{0, 1, false, true, "≥ 0 and < 1"};
const Range kEps{0, 1, true, false, "> 0 and ≤ 1"};
const Range kWeightDecay{0, 1e6, false, false, "≥ 0 and ≤ 1e6"};
const Range kUnitInterval{0, 1, false, false, "≥ 0 and ≤ 1"};
const Range kBucketElems{1, kMaxElems, false, false, "a whole number ≥ 1 and ≤ 1e15"};
const Range kPoolBuffers{1, kIntMax, false, false, "a whole number ≥ 1 and ≤ 2147483647"};
const Range kPrefetchElems{0, kMaxElems, false, false, "a whole number ≥ 0 and ≤ 1e15"};
const Range kLastBucketElems{0, kMaxElems, false, false, "a whole number ≥ 0 (0: no cap) and ≤ 1e15"};
const Range kMaxLiveElems{1, kMaxElems, false, false, "a whole number ≥ 1 and ≤ 1e15"};
const Range kPersistenceThreshold{0, kMaxElems, false, false, "a whole number ≥ 0 and ≤ 1e15"};
const Range kMaxReuseElems{0, kMaxElems, false, false, "a whole number ≥ 0 (0: keep none) and ≤ 1e15"};
const Range kAccumulation{1, kIntMax, false, false, "a whole number ≥ 1 and ≤ 2147483647"};
const Range kClip{0, std::numeric_limits<float>::max(), false, false,
                  "≥ 0 and finite (0 disables clipping)"};
const Range kInitialPower{0, 64, false, false, "a whole number ≥ 0 and ≤ 64"};
const Range kWindow{1, kIntMax, false, false, "a whole number ≥ 1 and ≤ 2147483647"};
const Range kHysteresis{1, kIntMax, false, false, "a whole number ≥ 1 and ≤ 2147483647"};
const Range kLossScaleMin{0, 0x1p64, true, false, "> 0 and ≤ 2^64"};
const Range kTimeout{0, 604800, false, false, "≥ 0 and ≤ 604800 (one week; 0 waits forever)"};
const Range kReplicaCheck{0, kIntMax, false, false,
                          "a whole number ≥ 0 and ≤ 2147483647 (0 never checks)"};
const Range kKeepLast{0, kIntMax, false, false, "a whole number ≥ 0 and ≤ 2147483647 (0 keeps all)"};
const Range kSteps{0, kMaxElems, false, false, "a whole number ≥ 0 and ≤ 1e15"};
const Range kTotalSteps{1, kMaxElems, false, false, "a whole number ≥ 1 and ≤ 1e15"};
const Range kBatch{0, kMaxElems, false, false, "a whole number ≥ 1 and ≤ 1e15 (0: not given)"};
// More groups than any model has; bounds what a config can make the engine allocate.
constexpr size_t kMaxParamGroups = kMaxOptimizerGroups;

Status CheckRange(absl::string_view key, double value, const Range& range, absl::string_view quoted) {
  if (range.Contains(value)) return absl::OkStatus();
  return KeyError(key, absl::StrCat(quoted, " is out of range; allowed: ", range.allowed));
}

// A nonzero value that a T stores as 0 or a subnormal (its precision lost, or about to be).
template <typename T>
Status TooSmall(absl::string_view key, absl::string_view quoted) {
  char smallest[32];  // in full: 6 digits would print a value just below it
  std::snprintf(smallest, sizeof smallest, "%.*g", std::numeric_limits<T>::max_digits10,
                static_cast<double>(std::numeric_limits<T>::min()));
  return KeyError(key, absl::StrCat(quoted, " is too small for a ", 8 * sizeof(T),
                                    "-bit float (the smallest normal one is ", smallest,
                                    "); use 0 or a larger value"));
}

// Validate's check of a stored value (quoted as it prints).
template <typename T>
Status CheckStored(absl::string_view key, T value, const Range& range) {
  const std::string quoted = absl::StrCat(value);
  ZERO_RETURN_IF_ERROR(CheckRange(key, static_cast<double>(value), range, quoted));
  if constexpr (std::is_floating_point_v<T>) {
    if (value != 0 && !std::isnormal(value)) return TooSmall<T>(key, quoted);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Number literals as written. The DOM keeps only the parsed double ("2e6" becomes 2000000.0,
// "1e-400" becomes 0), so a SAX pass records each float literal's text under the dotted path
// that ReadObject gives its key ("optimizer.eps", "optimizer.betas[1]"), and says where text
// that is not JSON breaks.
class NumberLiterals final : public Json::json_sax_t {
 public:
  // Parses `text`; false when it is not JSON, with error() saying why.
  bool Parse(std::string_view text) { return Json::sax_parse(text.begin(), text.end(), this); }
  const std::string& error() const { return error_; }
  // The literal at `path` as written, or null if it was not a float literal.
  const std::string* Find(const std::string& path) const {
    auto it = literals_.find(path);
    return it == literals_.end() ? nullptr : &it->second;
  }

  bool null() override { return Scalar(); }
  bool boolean(bool) override { return Scalar(); }
  bool number_integer(number_integer_t) override { return Scalar(); }
  bool number_unsigned(number_unsigned_t) override { return Scalar(); }
  bool number_float(number_float_t, const string_t& text) override {
    Scalar();
    if (tracked_) literals_[path_] = text;
    return true;
  }
  bool string(string_t&) override { return Scalar(); }
  bool binary(binary_t&) override { return Scalar(); }
  bool start_object(std::size_t) override { return Open(false); }
  bool start_array(std::size_t) override { return Open(true); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& name) override {
    Frame& object = frames_.back();
    if (!object.keys.insert(name).second) {  // the DOM would keep the last value silently
      const std::string key = object.path_size == 0 || !object.tracked
                                  ? name
                                  : absl::StrCat(path_.substr(0, object.path_size), ".", name);
      error_ = std::string(KeyError(key, "appears twice in its object; keep one").message());
      return false;
    }
    tracked_ = object.tracked && name.size() <= kMaxKey;
    if (tracked_) {
      path_.resize(object.path_size);
      absl::StrAppend(&path_, object.path_size == 0 ? "" : ".", name);
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string& token, const Json::exception& e) override {
    if (e.id == 406) {  // out_of_range.406: a number beyond a double, where a value begins
      BeginValue();
      if (tracked_ && !path_.empty()) {
        error_ = std::string(KeyError(path_, absl::StrCat(token, " is not a finite number")).message());
        return false;
      }
    }
    // nlohmann's message (with line and column) after its "[json.exception.…] " prefix.
    const std::string what = e.what();
    const size_t prefix = what.find("] ");
    error_ = absl::StrCat("config is not valid JSON: ", prefix == std::string::npos ? what : what.substr(prefix + 2));
    return false;
  }

 private:
  // Config keys are at most five levels deep (optimizer.param_groups[0].betas[1]) and short;
  // deeper or longer paths are not recorded, so any text parses in linear time.
  static constexpr size_t kMaxDepth = 5, kMaxKey = 64;
  static constexpr size_t kMaxNesting = 64;
  struct Frame {
    size_t path_size;  // the container's own path is path_[0, path_size)
    bool array;
    int64_t next = 0;  // arrays: the index of the next element
    bool tracked;
    std::set<std::string> keys = {};  // objects: the keys seen so far
  };

  // A value begins: inside an array, its path is the next index. Forgets an earlier literal
  // at the same path (a repeated key: the last one counts, as in the DOM).
  void BeginValue() {
    if (frames_.empty()) {
      tracked_ = true;
      path_.clear();
    } else if (frames_.back().array) {
      Frame& array = frames_.back();
      tracked_ = array.tracked;
      if (tracked_) {
        path_.resize(array.path_size);
        absl::StrAppend(&path_, "[", array.next, "]");
      }
      ++array.next;
    }
    if (tracked_) literals_.erase(path_);
  }
  bool Scalar() {
    BeginValue();
    return true;
  }
  bool Open(bool array) {
    if (frames_.size() >= kMaxNesting) {  // the DOM's copies and dumps recurse: bound the depth
      error_ = absl::StrCat("config is nested more than ", kMaxNesting, " levels deep");
      return false;
    }
    BeginValue();
    frames_.push_back({path_.size(), array, 0, tracked_ && frames_.size() < kMaxDepth});
    return true;
  }
  bool Close() {
    frames_.pop_back();
    return true;
  }

  std::vector<Frame> frames_;
  std::string path_;    // of the value being read, when tracked_
  bool tracked_ = true;
  std::map<std::string, std::string> literals_;
  std::string error_;
};

// A literal that denotes zero: no digit 1-9 before its exponent.
bool LiteralIsZero(absl::string_view literal) {
  for (char c : literal) {
    if (c == 'e' || c == 'E') break;
    if (c >= '1' && c <= '9') return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Reading the DOM: one handler per key.

// A value in the document and its dotted key.
struct Value {
  const Json& json;
  const std::string& key;
  const NumberLiterals& literals;

  // The value as written: a float literal's text, else the JSON (shortened).
  std::string Quoted() const {
    if (const std::string* literal = literals.Find(key)) return *literal;
    constexpr size_t kMax = 40;
    std::string text = json.dump(-1, ' ', false, Json::error_handler_t::replace);
    return text.size() <= kMax ? text : text.substr(0, kMax) + "…";
  }
};

using Handler = std::function<Status(const Value&)>;

// Reads an object's keys through one handler each; any other key is an error naming it.
Status ReadObject(const Value& object, const std::map<std::string, Handler>& handlers) {
  if (!object.json.is_object()) {
    return KeyError(object.key.empty() ? "(top level)" : object.key, "must be an object");
  }
  for (auto it = object.json.begin(); it != object.json.end(); ++it) {
    const std::string key = object.key.empty() ? it.key() : object.key + "." + it.key();
    auto handler = handlers.find(it.key());
    if (handler == handlers.end()) {
      std::string known;
      for (const auto& [name, unused] : handlers) absl::StrAppend(&known, known.empty() ? "" : ", ", name);
      return KeyError(key, absl::StrCat("unknown key; known keys here: ", known));
    }
    ZERO_RETURN_IF_ERROR(handler->second(Value{it.value(), key, object.literals}));
  }
  return absl::OkStatus();
}

// A number within `range`, stored as T only once it is known to fit: whole for integer
// keys, and for float keys neither rounded out of the range nor flushed to 0 or a subnormal.
template <typename T>
Status ReadNumber(const Value& v, const Range& range, T* out) {
  const std::string quoted = v.Quoted();
  if (v.json.is_string() && v.json.get<std::string>() == "auto") {
    return KeyError(v.key, absl::StrCat("\"auto\" is filled in by Hugging Face's Trainer, which is not here; write "
                                        "a number (allowed: ", range.allowed, ")"));
  }
  if (!v.json.is_number()) return KeyError(v.key, absl::StrCat(quoted, " is not a number; allowed: ", range.allowed));
  const double value = v.json.get<double>();
  if (value == 0 && !LiteralIsZero(quoted)) {
    return KeyError(v.key, absl::StrCat(quoted, " is too small to represent (it reads as 0); use 0 or a larger value"));
  }
  if (std::is_integral_v<T> && value != std::floor(value)) {
    return KeyError(v.key, absl::StrCat(quoted, " is not a whole number; allowed: ", range.allowed));
  }
  ZERO_RETURN_IF_ERROR(CheckRange(v.key, value, range, quoted));
  const T stored = static_cast<T>(value);
  if (!range.Contains(static_cast<double>(stored))) {
    return KeyError(v.key, absl::StrCat(quoted, " rounds to ", stored, " as a ", 8 * sizeof(T),
                                        "-bit float, out of range; allowed: ", range.allowed));
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (value != 0 && !std::isnormal(stored)) return TooSmall<T>(v.key, quoted);
  }
  *out = stored;
  return absl::OkStatus();
}

template <typename T>
Handler Number(T* out, const Range& range) {
  return [out, &range](const Value& v) { return ReadNumber(v, range, out); };
}

// A number stored into an optional (a param group's override).
template <typename T>
Handler OptionalNumber(std::optional<T>* out, const Range& range) {
  return [out, &range](const Value& v) -> Status {
    T value{};
    ZERO_RETURN_IF_ERROR(ReadNumber(v, range, &value));
    *out = value;
    return absl::OkStatus();
  };
}

Handler Bool(bool* out) {
  return [out](const Value& v) -> Status {
    if (!v.json.is_boolean()) return KeyError(v.key, absl::StrCat(v.Quoted(), " is not true or false"));
    *out = v.json.get<bool>();
    return absl::OkStatus();
  };
}

// A string that must be one of `choices`.
template <typename E>
Handler Choice(E* out, std::map<std::string, E> choices) {
  return [out, choices](const Value& v) -> Status {
    std::string names;
    for (const auto& [name, unused] : choices) absl::StrAppend(&names, names.empty() ? "" : ", ", name);
    if (!v.json.is_string()) return KeyError(v.key, absl::StrCat(v.Quoted(), " is not one of ", names));
    auto it = choices.find(v.json.get<std::string>());
    if (it == choices.end()) {
      return KeyError(v.key, absl::StrCat(v.Quoted(), " is not one of ", names));
    }
    *out = it->second;
    return absl::OkStatus();
  };
}

Handler DTypeKey(DType* out) {
  return Choice(out, std::map<std::string, DType>{
                         {"fp32", DType::kFP32}, {"bf16", DType::kBF16}, {"fp16", DType::kFP16}});
}

// "betas": [beta1, beta2], each element named by its index ("optimizer.betas[1]").
Handler Betas(float* beta1, float* beta2) {
  return [beta1, beta2](const Value& v) -> Status {
    if (!v.json.is_array() || v.json.size() != 2) {
      return KeyError(v.key, absl::StrCat(v.Quoted(), " is not a list of two numbers [beta1, beta2]"));
    }
    for (size_t i = 0; i < 2; ++i) {
      const std::string key = absl::StrCat(v.key, "[", i, "]");
      ZERO_RETURN_IF_ERROR(ReadNumber(Value{v.json[i], key, v.literals}, kBeta, i == 0 ? beta1 : beta2));
    }
    return absl::OkStatus();
  };
}

Handler OptionalBool(std::optional<bool>* out) {
  return [out](const Value& v) -> Status {
    bool value = false;
    ZERO_RETURN_IF_ERROR(Bool(&value)(v));
    *out = value;
    return absl::OkStatus();
  };
}

// "betas" of a param group: both or neither.
Handler OptionalBetas(std::optional<float>* beta1, std::optional<float>* beta2) {
  return [beta1, beta2](const Value& v) -> Status {
    float b1 = 0, b2 = 0;
    ZERO_RETURN_IF_ERROR(Betas(&b1, &b2)(v));
    *beta1 = b1;
    *beta2 = b2;
    return absl::OkStatus();
  };
}

// optimizer.param_groups: a list of objects, each with the optimizer's hyperparameter keys.
Handler ParamGroups(std::vector<ParamGroupOverrides>* out) {
  return [out](const Value& v) -> Status {
    if (!v.json.is_array()) {
      return KeyError(v.key, absl::StrCat(v.Quoted(), " is not a list of objects (one per group)"));
    }
    if (v.json.size() > kMaxParamGroups) {
      return KeyError(v.key, absl::StrCat("has ", v.json.size(), " groups; at most ", kMaxParamGroups));
    }
    std::vector<ParamGroupOverrides> groups(v.json.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      ParamGroupOverrides& o = groups[g];
      const std::map<std::string, Handler> keys = {
          {"lr", OptionalNumber(&o.lr, kLr)}, {"betas", OptionalBetas(&o.beta1, &o.beta2)},
          {"eps", OptionalNumber(&o.eps, kEps)}, {"weight_decay", OptionalNumber(&o.weight_decay, kWeightDecay)},
          {"momentum", OptionalNumber(&o.momentum, kUnitInterval)},
          {"dampening", OptionalNumber(&o.dampening, kUnitInterval)}, {"nesterov", OptionalBool(&o.nesterov)}};
      const std::string key = absl::StrCat(v.key, "[", g, "]");
      ZERO_RETURN_IF_ERROR(ReadObject(Value{v.json[g], key, v.literals}, keys));
    }
    *out = std::move(groups);
    return absl::OkStatus();
  };
}

// Validate's check of one group's resolved hyperparameters; `prefix` names where they come
// from ("optimizer" or "optimizer.param_groups[1]").
Status CheckHyper(const std::string& prefix, const OptimizerHyper& o) {
  ZERO_RETURN_IF_ERROR(CheckStored(prefix + ".lr", o.lr, kLr));
  ZERO_RETURN_IF_ERROR(CheckStored(prefix + ".betas[0]", o.beta1, kBeta));
  ZERO_RETURN_IF_ERROR(CheckStored(prefix + ".betas[1]", o.beta2, kBeta));
  ZERO_RETURN_IF_ERROR(CheckStored(prefix + ".eps", o.eps, kEps));
  ZERO_RETURN_IF_ERROR(CheckStored(prefix + ".weight_decay", o.weight_decay, kWeightDecay));
  ZERO_RETURN_IF_ERROR(CheckStored(prefix + ".momentum", o.momentum, kUnitInterval));
  ZERO_RETURN_IF_ERROR(CheckStored(prefix + ".dampening", o.dampening, kUnitInterval));
  if (o.nesterov && (o.momentum == 0 || o.dampening != 0)) {
    return KeyError(prefix + ".nesterov", "needs momentum > 0 and dampening = 0");
  }
  return absl::OkStatus();
}

}  // namespace

OptimizerHyper OptimizerConfig::Group(int group) const {
  OptimizerHyper h = *this;
  if (group < 0 || static_cast<size_t>(group) >= param_groups.size()) return h;
  const ParamGroupOverrides& o = param_groups[group];
  h.lr = o.lr.value_or(h.lr);
  h.beta1 = o.beta1.value_or(h.beta1);
  h.beta2 = o.beta2.value_or(h.beta2);
  h.eps = o.eps.value_or(h.eps);
  h.weight_decay = o.weight_decay.value_or(h.weight_decay);
  h.momentum = o.momentum.value_or(h.momentum);
  h.dampening = o.dampening.value_or(h.dampening);
  h.nesterov = o.nesterov.value_or(h.nesterov);
  return h;
}

StatusOr<std::string> NormalizeConfigJson(std::string_view text) {
  const Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  std::string normalized(text);
  ZERO_RETURN_IF_ERROR(Config::FromJson(text).status());  // a DeepSpeed key named as written
  if (!json.is_discarded() && runtime::IsDeepSpeedConfig(json)) {
    ZERO_ASSIGN_OR_RETURN(const Json translated, runtime::TranslateDeepSpeedConfig(json, nullptr));
    normalized = translated.dump();
  }
  return normalized;
}

bool IsDeepSpeedConfigJson(std::string_view text) {
  const Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  return !json.is_discarded() && runtime::IsDeepSpeedConfig(json);
}

Status ValidateOptimizerHyper(const OptimizerHyper& hyper, const std::string& where) {
  return CheckHyper(where, hyper);
}

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
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return absl::InvalidArgumentError("config is empty (a file that failed to load?); pass {} for the defaults");
  }
  NumberLiterals literals;
  if (!literals.Parse(text)) return absl::InvalidArgumentError(literals.error());
  const Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError("config is not valid JSON");
  if (runtime::IsDeepSpeedConfig(json)) {
    std::vector<std::string> notes;
    runtime::KeyOrigins origins;
    ZERO_ASSIGN_OR_RETURN(const Json translated, runtime::TranslateDeepSpeedConfig(json, &notes, &origins));
    if (runtime::IsDeepSpeedConfig(translated)) {
      return absl::InternalError("the DeepSpeed config's translation is not a ZeroRT config");
    }
    StatusOr<Config> config = FromJson(translated.dump());
    if (!config.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DeepSpeed config, as translated: ", runtime::NameDeepSpeedKeys(std::string(config.status().message()), origins)));
    }
    config->notes = std::move(notes);
    return config;
  }
  Config c;
  OptimizerConfig& o = c.optimizer;
  const std::map<std::string, Handler> optimizer = {
      {"type", Choice(&o.type, std::map<std::string, OptimizerType>{
                                   {"adam", OptimizerType::kAdam}, {"adamw", OptimizerType::kAdamW},
                                   {"sgd", OptimizerType::kSgd}, {"lamb", OptimizerType::kLamb},
                                   {"lion", OptimizerType::kLion}})},
      {"lr", Number(&o.lr, kLr)}, {"betas", Betas(&o.beta1, &o.beta2)}, {"eps", Number(&o.eps, kEps)},
      {"weight_decay", Number(&o.weight_decay, kWeightDecay)}, {"momentum", Number(&o.momentum, kUnitInterval)},
      {"dampening", Number(&o.dampening, kUnitInterval)}, {"nesterov", Bool(&o.nesterov)},
      {"param_groups", ParamGroups(&o.param_groups)}};
  SchedulerConfig& sc = c.scheduler;
  const std::map<std::string, Handler> scheduler_params = {
      {"warmup_min_lr", Number(&sc.warmup_min_lr, kLr)}, {"warmup_max_lr", OptionalNumber(&sc.warmup_max_lr, kLr)},
      {"warmup_num_steps", Number(&sc.warmup_num_steps, kSteps)},
      {"warmup_type", Choice(&sc.warmup_type, std::map<std::string, WarmupType>{
                                                  {"log", WarmupType::kLog}, {"linear", WarmupType::kLinear}})},
      {"total_num_steps", Number(&sc.total_num_steps, kTotalSteps)},
      {"warmup_min_ratio", Number(&sc.warmup_min_ratio, kUnitInterval)},
      {"cos_min_ratio", Number(&sc.cos_min_ratio, kUnitInterval)}};
  const std::map<std::string, Handler> batch = {
      {"train_batch_size", Number(&c.batch.train_batch_size, kBatch)},
      {"micro_batch_size_per_rank", Number(&c.batch.micro_batch_size_per_rank, kBatch)}};
  const std::map<std::string, Handler> precision = {
      {"param", DTypeKey(&c.precision.param)}, {"grad", DTypeKey(&c.precision.grad)},
      {"reduce", DTypeKey(&c.precision.reduce)}, {"master_weights", Bool(&c.precision.master_weights)}};
  const std::map<std::string, Handler> buckets = {
      {"reduce_bucket_elems", Number(&c.buckets.reduce_bucket_elems, kBucketElems)},
      {"first_bucket_elems", Number(&c.buckets.first_bucket_elems, kBucketElems)},
      {"last_bucket_elems", Number(&c.buckets.last_bucket_elems, kLastBucketElems)},
      {"overlap", Bool(&c.buckets.overlap)}, {"pool_buffers", Number(&c.buckets.pool_buffers, kPoolBuffers)},
      {"grow_pool", Bool(&c.buckets.grow_pool)}};
  const std::map<std::string, Handler> stage3 = {
      {"prefetch_elems", Number(&c.stage3.prefetch_elems, kPrefetchElems)},
      {"max_live_elems", Number(&c.stage3.max_live_elems, kMaxLiveElems)},
      {"persistence_threshold", Number(&c.stage3.persistence_threshold, kPersistenceThreshold)},
      {"max_reuse_elems", Number(&c.stage3.max_reuse_elems, kMaxReuseElems)}};
  const std::map<std::string, Handler> loss_scale = {
      {"mode", Choice(&c.loss_scale.mode, std::map<std::string, LossScaleMode>{
                                              {"none", LossScaleMode::kNone},
                                              {"static", LossScaleMode::kStatic},
                                              {"dynamic", LossScaleMode::kDynamic}})},
      {"initial_power", Number(&c.loss_scale.initial_power, kInitialPower)},
      {"window", Number(&c.loss_scale.window, kWindow)},
      {"hysteresis", Number(&c.loss_scale.hysteresis, kHysteresis)},
      {"min", Number(&c.loss_scale.min, kLossScaleMin)}};
  const std::map<std::string, Handler> guard = {
      {"on_duplicate", Choice(&c.guard.on_duplicate, std::map<std::string, DuplicatePolicy>{
                                                         {"error", DuplicatePolicy::kError},
                                                         {"count", DuplicatePolicy::kCount}})},
      {"on_unused", Choice(&c.guard.on_unused, std::map<std::string, UnusedPolicy>{
                                                   {"error", UnusedPolicy::kError},
                                                   {"zero", UnusedPolicy::kZero}})},
      {"consistency_check", Bool(&c.guard.consistency_check)},
      {"timeout_s", Number(&c.guard.timeout_s, kTimeout)},
      {"init_params", Choice(&c.guard.init_params, std::map<std::string, InitParams>{
                                                       {"broadcast", InitParams::kBroadcast},
                                                       {"verify", InitParams::kVerify}})},
      {"replica_check_every", Number(&c.guard.replica_check_every, kReplicaCheck)}};
  const std::map<std::string, Handler> checkpoint = {
      {"keep_last", Number(&c.checkpoint.keep_last, kKeepLast)},
      {"save_frozen", Bool(&c.checkpoint.save_frozen)}};
  auto section = [](const std::map<std::string, Handler>& handlers) -> Handler {
    return [&handlers](const Value& v) { return ReadObject(v, handlers); };
  };
  const std::map<std::string, Handler> scheduler = {
      {"type", Choice(&sc.type, std::map<std::string, LrScheduleType>{
                                    {"WarmupLR", LrScheduleType::kWarmupLR},
                                    {"WarmupDecayLR", LrScheduleType::kWarmupDecayLR},
                                    {"WarmupCosineLR", LrScheduleType::kWarmupCosineLR}})},
      {"params", section(scheduler_params)}};
  const std::map<std::string, Handler> top = {
      {"stage", Number(&c.stage, kStage)},
      {"device", Choice(&c.device, std::map<std::string, Device>{{"cpu", Device::kCpu}, {"cuda", Device::kCuda}})},
      {"optimizer", section(optimizer)}, {"precision", section(precision)}, {"buckets", section(buckets)},
      {"stage3", section(stage3)},
      {"gradient_accumulation_steps", Number(&c.gradient_accumulation_steps, kAccumulation)},
      {"clip_grad_norm", Number(&c.clip_grad_norm, kClip)}, {"sync_grad_norm", Bool(&c.sync_grad_norm)},
      {"loss_scale", section(loss_scale)},
      {"guard", section(guard)}, {"checkpoint", section(checkpoint)}, {"scheduler", section(scheduler)},
      {"batch", section(batch)}};
  const std::string root;
  ZERO_RETURN_IF_ERROR(ReadObject(Value{json, root, literals}, top));
  const auto section_of_scheduler = json.find("scheduler");
  if (section_of_scheduler != json.end() && !section_of_scheduler->empty() && !section_of_scheduler->contains("type")) {
    return KeyError("scheduler", "has no \"type\", so its params would do nothing; name one of WarmupLR, "
                                 "WarmupDecayLR or WarmupCosineLR, or drop the section");
  }
  // Without optimizer.weight_decay, the type's own default, as PyTorch's optimizers have it
  // (AdamW 0.01; Adam and SGD 0) and Lion's and LAMB's reference ones (0).
  const auto section_of_optimizer = json.find("optimizer");
  if (section_of_optimizer == json.end() || !section_of_optimizer->contains("weight_decay")) {
    o.weight_decay = o.type == OptimizerType::kAdamW ? 0.01f : 0.0f;
  }
  ZERO_RETURN_IF_ERROR(c.Validate());
  return c;
}

namespace {

// A stored enum field (a C++ caller may cast any int into one): one of its `choices` values,
// counted from 0.
template <typename Enum>
Status CheckEnum(absl::string_view key, Enum value, int choices) {
  const int stored = static_cast<int>(value);
  if (stored >= 0 && stored < choices) return absl::OkStatus();
  return KeyError(key, absl::StrCat("holds ", stored, ", which is none of its ", choices, " choices (0-", choices - 1, ")"));
}

// The enum fields, each with its number of choices (precision: fp32, bf16, fp16 only).
static_assert(static_cast<int>(Device::kCuda) == 1 && static_cast<int>(OptimizerType::kLion) == 4 &&
                  static_cast<int>(LrScheduleType::kWarmupCosineLR) == 3 &&
                  static_cast<int>(WarmupType::kLinear) == 1 && static_cast<int>(DType::kFP16) == 2 &&
                  static_cast<int>(LossScaleMode::kDynamic) == 2 &&
                  static_cast<int>(DuplicatePolicy::kCount) == 1 && static_cast<int>(UnusedPolicy::kZero) == 1 &&
                  static_cast<int>(InitParams::kVerify) == 1,
              "CheckEnums counts each enum's choices");
Status CheckEnums(const Config& c) {
  ZERO_RETURN_IF_ERROR(CheckEnum("device", c.device, 2));
  ZERO_RETURN_IF_ERROR(CheckEnum("optimizer.type", c.optimizer.type, 5));
  ZERO_RETURN_IF_ERROR(CheckEnum("scheduler.type", c.scheduler.type, 4));
  ZERO_RETURN_IF_ERROR(CheckEnum("scheduler.params.warmup_type", c.scheduler.warmup_type, 2));
  ZERO_RETURN_IF_ERROR(CheckEnum("precision.param", c.precision.param, 3));
  ZERO_RETURN_IF_ERROR(CheckEnum("precision.grad", c.precision.grad, 3));
  ZERO_RETURN_IF_ERROR(CheckEnum("precision.reduce", c.precision.reduce, 3));
  ZERO_RETURN_IF_ERROR(CheckEnum("loss_scale.mode", c.loss_scale.mode, 3));
  ZERO_RETURN_IF_ERROR(CheckEnum("guard.on_duplicate", c.guard.on_duplicate, 2));
  ZERO_RETURN_IF_ERROR(CheckEnum("guard.on_unused", c.guard.on_unused, 2));
  return CheckEnum("guard.init_params", c.guard.init_params, 2);
}

}  // namespace

Status Config::Validate() const {
  ZERO_RETURN_IF_ERROR(CheckEnums(*this));
  ZERO_RETURN_IF_ERROR(CheckStored("stage", stage, kStage));
  ZERO_RETURN_IF_ERROR(CheckHyper("optimizer", optimizer));
  if (optimizer.param_groups.size() > kMaxParamGroups) {
    return KeyError("optimizer.param_groups", absl::StrCat("has ", optimizer.param_groups.size(),
                                                           " groups; at most ", kMaxParamGroups));
  }
  for (size_t g = 0; g < optimizer.param_groups.size(); ++g) {
    ZERO_RETURN_IF_ERROR(CheckHyper(absl::StrCat("optimizer.param_groups[", g, "]"), optimizer.Group(static_cast<int>(g))));
  }
  ZERO_RETURN_IF_ERROR(CheckStored("scheduler.params.warmup_min_lr", scheduler.warmup_min_lr, kLr));
  if (scheduler.warmup_max_lr) {
    ZERO_RETURN_IF_ERROR(CheckStored("scheduler.params.warmup_max_lr", *scheduler.warmup_max_lr, kLr));
  }
  ZERO_RETURN_IF_ERROR(CheckStored("scheduler.params.warmup_num_steps", scheduler.warmup_num_steps, kSteps));
  ZERO_RETURN_IF_ERROR(CheckStored("scheduler.params.warmup_min_ratio", scheduler.warmup_min_ratio, kUnitInterval));
  ZERO_RETURN_IF_ERROR(CheckStored("scheduler.params.cos_min_ratio", scheduler.cos_min_ratio, kUnitInterval));
  if (scheduler.type == LrScheduleType::kWarmupDecayLR || scheduler.type == LrScheduleType::kWarmupCosineLR) {
    if (scheduler.total_num_steps < 1) {
      return KeyError("scheduler.params.total_num_steps",
                      "is required by WarmupDecayLR and WarmupCosineLR (the step at which the decay ends)");
    }
    ZERO_RETURN_IF_ERROR(CheckStored("scheduler.params.total_num_steps", scheduler.total_num_steps, kTotalSteps));
  }
  ZERO_RETURN_IF_ERROR(CheckStored("batch.train_batch_size", batch.train_batch_size, kBatch));
  ZERO_RETURN_IF_ERROR(CheckStored("batch.micro_batch_size_per_rank", batch.micro_batch_size_per_rank, kBatch));
  ZERO_RETURN_IF_ERROR(CheckStored("buckets.reduce_bucket_elems", buckets.reduce_bucket_elems, kBucketElems));
  ZERO_RETURN_IF_ERROR(CheckStored("buckets.first_bucket_elems", buckets.first_bucket_elems, kBucketElems));
  ZERO_RETURN_IF_ERROR(CheckStored("buckets.last_bucket_elems", buckets.last_bucket_elems, kLastBucketElems));
  ZERO_RETURN_IF_ERROR(CheckStored("buckets.pool_buffers", buckets.pool_buffers, kPoolBuffers));
  ZERO_RETURN_IF_ERROR(CheckStored("stage3.prefetch_elems", stage3.prefetch_elems, kPrefetchElems));
  ZERO_RETURN_IF_ERROR(CheckStored("stage3.max_live_elems", stage3.max_live_elems, kMaxLiveElems));
  ZERO_RETURN_IF_ERROR(
      CheckStored("stage3.persistence_threshold", stage3.persistence_threshold, kPersistenceThreshold));
  ZERO_RETURN_IF_ERROR(CheckStored("stage3.max_reuse_elems", stage3.max_reuse_elems, kMaxReuseElems));
  ZERO_RETURN_IF_ERROR(CheckStored("gradient_accumulation_steps", gradient_accumulation_steps, kAccumulation));
  ZERO_RETURN_IF_ERROR(CheckStored("clip_grad_norm", clip_grad_norm, kClip));
  ZERO_RETURN_IF_ERROR(CheckStored("loss_scale.initial_power", loss_scale.initial_power, kInitialPower));
  ZERO_RETURN_IF_ERROR(CheckStored("loss_scale.window", loss_scale.window, kWindow));
  ZERO_RETURN_IF_ERROR(CheckStored("loss_scale.hysteresis", loss_scale.hysteresis, kHysteresis));
  ZERO_RETURN_IF_ERROR(CheckStored("loss_scale.min", loss_scale.min, kLossScaleMin));
  ZERO_RETURN_IF_ERROR(CheckStored("guard.timeout_s", guard.timeout_s, kTimeout));
  ZERO_RETURN_IF_ERROR(CheckStored("guard.replica_check_every", guard.replica_check_every, kReplicaCheck));
  return CheckStored("checkpoint.keep_last", checkpoint.keep_last, kKeepLast);
}

}  // namespace zero
