// DeepSpeed configs translated into ZeroRT's JSON: realistic ZeRO-2 and ZeRO-3 configs key by
// key, DeepSpeed's defaults (Adam is AdamW without weight decay, clipping at 1.0, stage 0),
// Hugging Face's "auto", the notes for keys that only tune DeepSpeed, and one error naming
// every unsupported key; a refused value named by the DeepSpeed key it was written under.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/deepspeed_config.h"
#include "tests/status_matchers.h"
#include "zero/config.h"

namespace zero::runtime {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using zero::testing::IsOk;
using zero::testing::StatusIs;
using Json = nlohmann::json;

/// Translates `text`; the test fails if the translation does.
Json Translate(const std::string& text, std::vector<std::string>* notes = nullptr) {
  std::vector<std::string> ignored;
  StatusOr<Json> out = TranslateDeepSpeedConfig(Json::parse(text), notes != nullptr ? notes : &ignored);
  EXPECT_THAT(out, IsOk()) << text;
  return out.ok() ? *out : Json();
}

/// The translation's error message (empty, and a test failure, if it succeeded).
std::string Error(const std::string& text) {
  std::vector<std::string> notes;
  StatusOr<Json> out = TranslateDeepSpeedConfig(Json::parse(text), &notes);
  EXPECT_THAT(out, StatusIs(absl::StatusCode::kInvalidArgument)) << text;
  return out.ok() ? "" : std::string(out.status().message());
}

/// Compares two configs leaf by leaf (by JSON pointer), naming each difference.
void ExpectSameKeys(const Json& actual, const Json& expected) {
  const Json a = actual.flatten(), e = expected.flatten();
  for (auto it = e.begin(); it != e.end(); ++it) {
    if (!a.contains(it.key())) {
      ADD_FAILURE() << "missing " << it.key() << " (expected " << it->dump() << ")";
    } else {
      EXPECT_EQ(a[it.key()], *it) << "at " << it.key();
    }
  }
  for (auto it = a.begin(); it != a.end(); ++it) {
    if (!e.contains(it.key())) ADD_FAILURE() << "unexpected " << it.key() << " = " << it->dump();
  }
}

// Hugging Face's ds_config_zero2.json with the Trainer's "auto" values written out.
constexpr char kZero2Bf16[] = R"({
  "fp16": {"enabled": false, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
           "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW",
                "params": {"lr": 3e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 500,
                           "total_num_steps": 10000}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"},
                        "allgather_partitions": true, "allgather_bucket_size": 2e8,
                        "overlap_comm": true, "reduce_scatter": true, "reduce_bucket_size": 2e8,
                        "contiguous_gradients": true},
  "gradient_accumulation_steps": 4, "gradient_clipping": 1.0, "steps_per_print": 2000,
  "train_batch_size": 128, "train_micro_batch_size_per_gpu": 4, "wall_clock_breakdown": false
})";

TEST(DeepSpeedConfig, Zero2Bf16TranslatesKeyByKey) {
  std::vector<std::string> notes;
  ExpectSameKeys(Translate(kZero2Bf16, &notes), Json::parse(R"({
    "stage": 2,
    "buckets": {"reduce_bucket_elems": 2e8, "overlap": true},
    "optimizer": {"type": "adamw", "lr": 3e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 500,
                             "total_num_steps": 10000}},
    "precision": {"param": "bf16", "grad": "bf16", "reduce": "bf16"},
    "loss_scale": {"mode": "static", "initial_power": 0},
    "batch": {"train_batch_size": 128, "micro_batch_size_per_rank": 4},
    "gradient_accumulation_steps": 4,
    "clip_grad_norm": 1.0
  })"));
  for (const char* key : {"zero_optimization.allgather_partitions", "zero_optimization.allgather_bucket_size",
                          "zero_optimization.reduce_scatter", "zero_optimization.contiguous_gradients",
                          "steps_per_print", "wall_clock_breakdown"}) {
    EXPECT_THAT(notes, Contains(StartsWith(std::string(key) + ": ignored; "))) << key;
  }
  // bf16's check_grad_overflow (true by default) skips steps with Inf/NaN gradients.
  EXPECT_THAT(notes, Contains(StartsWith("bf16.check_grad_overflow: ")));
}

constexpr char kZero3Fp16[] = R"({
  "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 500, "initial_scale_power": 12,
           "hysteresis": 2, "min_loss_scale": 1},
  "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8}},
  "scheduler": {"type": "WarmupLR",
                "params": {"warmup_min_lr": 0, "warmup_num_steps": 100, "warmup_type": "linear"}},
  "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true,
                        "sub_group_size": 1e9, "reduce_bucket_size": 5e7,
                        "stage3_prefetch_bucket_size": 4.5e7,
                        "stage3_param_persistence_threshold": 1e4,
                        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                        "stage3_gather_16bit_weights_on_model_save": true,
                        "ignore_unused_parameters": true},
  "data_types": {"grad_accum_dtype": "fp32"},
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8
})";

TEST(DeepSpeedConfig, Zero3Fp16TranslatesKeyByKey) {
  std::vector<std::string> notes;
  ExpectSameKeys(Translate(kZero3Fp16, &notes), Json::parse(R"({
    "stage": 3,
    "buckets": {"reduce_bucket_elems": 5e7, "overlap": true},
    "stage3": {"prefetch_elems": 4.5e7, "persistence_threshold": 1e4, "max_live_elems": 1e9,
               "max_reuse_elems": 1e9},
    "guard": {"on_unused": "zero"},
    "optimizer": {"type": "adamw", "lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_min_lr": 0, "warmup_num_steps": 100, "warmup_type": "linear"}},
    "precision": {"param": "fp16", "grad": "fp32", "reduce": "fp32"},
    "loss_scale": {"mode": "dynamic", "initial_power": 12, "window": 500, "hysteresis": 2, "min": 1},
    "batch": {"micro_batch_size_per_rank": 2},
    "gradient_accumulation_steps": 8,
    "clip_grad_norm": 1.0
  })"));
  for (const char* key : {"zero_optimization.sub_group_size",
                          "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                          "zero_optimization.contiguous_gradients"}) {
    EXPECT_THAT(notes, Contains(StartsWith(std::string(key) + ": ignored; "))) << key;
  }
  EXPECT_THAT(notes, Contains(AllOf(StartsWith("gradient_clipping: not given"), HasSubstr("1.0"))));
  EXPECT_THAT(notes, Contains(AllOf(StartsWith("optimizer.type: "), HasSubstr("AdamW"))));
  EXPECT_THAT(notes, Contains(StartsWith("communication_data_type: not given")));
}

TEST(DeepSpeedConfig, DefaultsAreDeepSpeeds) {
  // Stage 0, clipping at 1.0 (DeepSpeed's default since v0.19.3), fp32 and no loss scale
  // without fp16/bf16; "Adam" without weight_decay is AdamW with weight decay 0.
  Json out = Translate(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 0.01}}})");
  EXPECT_EQ(out["stage"], 0);
  EXPECT_EQ(out["clip_grad_norm"], 1.0);
  EXPECT_EQ(out["optimizer"]["type"], "adamw");
  EXPECT_EQ(out["optimizer"]["weight_decay"], 0.0);
  EXPECT_EQ(out["precision"], Json::parse(R"({"param": "fp32", "grad": "fp32", "reduce": "fp32"})"));
  EXPECT_FALSE(out.contains("loss_scale"));
  EXPECT_EQ(out["batch"]["train_batch_size"], 8);
  EXPECT_EQ(Translate(R"({"train_batch_size": 8, "gradient_clipping": 0})")["clip_grad_norm"], 0);
}

TEST(DeepSpeedConfig, OptimizerTypesAreCaseInsensitive) {
  struct Case {
    const char* type;
    const char* params;
    const char* zero_type;
    double weight_decay;
  };
  for (const Case& c : std::vector<Case>{
           {"adam", "{}", "adamw", 0.0},
           {"ADAM", R"({"adam_w_mode": false})", "adam", 0.0},
           {"AdamW", R"({"adam_w_mode": false})", "adamw", 0.0},  // "AdamW" is always AdamW
           {"Adam", R"({"torch_adam": true})", "adamw", 0.01},     // torch.optim.AdamW's default
           {"adamw", R"({"weight_decay": 0.05})", "adamw", 0.05},
           {"LAMB", "{}", "lamb", 0.0},
           {"Lion", R"({"betas": [0.9, 0.99]})", "lion", 0.0},
           {"SGD", R"({"momentum": 0.9, "nesterov": true})", "sgd", 0.0},
           {"sgd", "{}", "sgd", 0.0}}) {
    const std::string text = std::string(R"({"bf16": {"enabled": true}, "optimizer": {"type": ")") + c.type +
                             R"(", "params": )" + c.params + "}}";
    Json out = Translate(text);
    EXPECT_EQ(out["optimizer"]["type"], c.zero_type) << text;
    EXPECT_EQ(out["optimizer"]["weight_decay"], c.weight_decay) << text;
  }
  EXPECT_THAT(Error(R"({"fp16": {"enabled": true}, "optimizer": {"type": "Adagrad"}})"),
              HasSubstr("optimizer.type: \"Adagrad\" is not supported; write Adam, AdamW, Lamb, Lion or SGD"));
  EXPECT_THAT(Error(R"({"fp16": {"enabled": true}, "optimizer": {"type": "Adam", "params": {"momentum": 0.9}}})"),
              HasSubstr("optimizer.params.momentum: Adam takes no momentum"));
}

TEST(DeepSpeedConfig, EveryUnsupportedKeyInOneError) {
  const std::string message = Error(R"({
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}},
    "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-5}},
    "amp": {"enabled": true, "opt_level": "O1"}
  })");
  EXPECT_THAT(message, StartsWith("DeepSpeed config: 3 keys are not supported:\n"));
  EXPECT_THAT(message, HasSubstr("\nzero_optimization.offload_optimizer: not supported yet; remove it "
                                 "(ZeroRT keeps optimizer states on the engine's device)"));
  EXPECT_THAT(message, HasSubstr("\nscheduler.type: \"OneCycle\" is not supported"));
  EXPECT_THAT(message, HasSubstr("\namp: Apex AMP is not supported"));
  EXPECT_EQ(std::count(message.begin(), message.end(), '\n'), 3) << message;

  EXPECT_THAT(Error(R"({"train_batch_size": 8, "sparse_attention": {"mode": "fixed"}})"),
              AllOf(StartsWith("DeepSpeed config: 1 key is not supported:\n"),
                    HasSubstr("sparse_attention: not a DeepSpeed key that ZeroRT supports; remove it")));
  // A misspelt key names the one meant, at any depth; a key near none names none.
  EXPECT_THAT(Error(R"({"gradient_acumulation_steps": 2, "zero_optimization": {"stagee": 2}})"),
              AllOf(HasSubstr("gradient_acumulation_steps: not a DeepSpeed key that ZeroRT supports; remove "
                              "it; did you mean \"gradient_accumulation_steps\"?"),
                    HasSubstr("zero_optimization.stagee: not a DeepSpeed key that ZeroRT supports; remove it; "
                              "did you mean \"stage\"?")));
  EXPECT_THAT(Error(R"({"zero_optimization": {"stage": 1}, "sparse_attention": {}})"),
              Not(HasSubstr("did you mean")));
}

// ZeroRT's own keys mixed into a DeepSpeed config name DeepSpeed's form instead of "remove it"
// (which would drop the stage silently); an optimizer setting beside "type" names "params".
TEST(DeepSpeedConfig, ZeroRtKeysAndMisplacedOptimizerSettingsNameDeepSpeedsForm) {
  EXPECT_THAT(Error(R"({"stage": 2, "bf16": {"enabled": true}})"),
              AllOf(HasSubstr("stage: ZeroRT's own key in a config read as DeepSpeed's"),
                    HasSubstr("write it as zero_optimization.stage"), Not(HasSubstr("remove it"))));
  EXPECT_THAT(Error(R"({"fp16": {"enabled": true}, "precision": {"grad": "fp32"}})"),
              HasSubstr("write it as bf16.enabled, fp16.enabled and data_types.grad_accum_dtype"));
  EXPECT_THAT(Error(R"({"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "lr": 0.001}})"),
              HasSubstr("optimizer.lr: DeepSpeed takes the optimizer's settings inside its \"params\": write it as "
                        "optimizer.params.lr"));
  EXPECT_THAT(Error(R"({"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "lrr": 0.001}})"),
              HasSubstr("optimizer.lrr: not a DeepSpeed key that ZeroRT supports; remove it"));
}

TEST(DeepSpeedConfig, KeysOfDeepSpeedWithoutAKnobHereAreNoted) {
  std::vector<std::string> notes;
  Translate(R"({"memory_breakdown": true, "sparse_gradients": false,
                "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}})",
            &notes);
  EXPECT_THAT(notes, Contains(HasSubstr("memory_breakdown: ignored")));
  EXPECT_THAT(notes, Contains(HasSubstr("stage3_gather_fp16_weights_on_model_save: ignored")));
  notes.clear();
  Translate(R"({"sparse_gradients": true})", &notes);
  EXPECT_THAT(notes, Contains(HasSubstr("sparse_gradients: ignored")));
  // Leaf modules are the PyTorch package's: the engine notes them and says who reads them.
  notes.clear();
  Translate(R"({"zero_optimization": {"stage": 3, "leaf_module": {"classes": ["MoEBlock"]},
                                      "stage3_module_granularity_threshold": 1000}})",
            &notes);
  EXPECT_THAT(notes, Contains(AllOf(HasSubstr("zero_optimization.leaf_module: ignored"),
                                    HasSubstr("zerort.torch reads it"))));
  EXPECT_THAT(notes, Contains(HasSubstr("stage3_module_granularity_threshold: ignored")));
}

TEST(DeepSpeedConfig, AutoIsResolvedWhereDerivableAndNamedOtherwise) {
  // What Hugging Face's Trainer leaves for itself: lr, dtypes, steps, clipping, accumulation.
  const std::string message = Error(R"({
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 2},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"
  })");
  EXPECT_THAT(message, StartsWith("DeepSpeed config: 7 keys are not supported:\n"));
  for (const char* key : {"bf16.enabled", "optimizer.params.lr", "optimizer.params.weight_decay",
                          "scheduler.params.warmup_num_steps", "scheduler.params.total_num_steps",
                          "gradient_accumulation_steps", "gradient_clipping"}) {
    EXPECT_THAT(message, HasSubstr(std::string("\n") + key + ": \"auto\" is filled in by Hugging Face's Trainer"))
        << key;
  }
  EXPECT_THAT(message, HasSubstr("write the learning rate"));
  EXPECT_THAT(message, Not(HasSubstr("train_batch_size")));

  // Derivable: batch sizes (the engine does not need them), the scheduler's lrs (0 and the
  // optimizer's lr, as the Trainer writes), bucket sizes (ZeroRT's defaults).
  std::vector<std::string> notes;
  Json out = Translate(R"({
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-5}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto"}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto"},
    "gradient_accumulation_steps": 2, "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"
  })", &notes);
  EXPECT_EQ(out["scheduler"]["params"]["warmup_min_lr"], 0);
  EXPECT_EQ(out["scheduler"]["params"]["warmup_max_lr"], 2e-5);
  EXPECT_FALSE(out.contains("buckets"));
  EXPECT_FALSE(out.contains("stage3"));
  EXPECT_FALSE(out.contains("batch"));
  EXPECT_EQ(out["gradient_accumulation_steps"], 2);
  for (const char* key : {"zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                          "train_batch_size", "train_micro_batch_size_per_gpu", "scheduler.params.warmup_max_lr"}) {
    EXPECT_THAT(notes, Contains(StartsWith(std::string(key) + ": \"auto\""))) << key;
  }
}

TEST(DeepSpeedConfig, BatchKeysNeedingTheWorldSizeAreLeftToTheEngine) {
  std::vector<std::string> notes;
  Json out = Translate(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", &notes);
  EXPECT_EQ(out["batch"], Json::parse(R"({"train_batch_size": 32, "micro_batch_size_per_rank": 4})"));
  EXPECT_FALSE(out.contains("gradient_accumulation_steps"));
  EXPECT_THAT(notes, Contains(StartsWith("gradient_accumulation_steps: not given")));
  // train = micro × accumulation × world with train = micro: accumulation 1, whatever the world.
  out = Translate(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8})");
  EXPECT_EQ(out["gradient_accumulation_steps"], 1);
  EXPECT_THAT(Error(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})"),
              HasSubstr("train_batch_size: 30 is not a multiple of train_micro_batch_size_per_gpu (4)"));
  EXPECT_THAT(Error(R"({"train_batch_size": 2.5})"), HasSubstr("train_batch_size: 2.5 is not a whole number"));
}

TEST(DeepSpeedConfig, PrecisionAndLossScale) {
  EXPECT_THAT(Error(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"),
              HasSubstr("bf16.enabled: fp16.enabled is true too"));
  Json out = Translate(R"({"fp16": {"enabled": true, "loss_scale": 1024}})");
  EXPECT_EQ(out["loss_scale"], Json::parse(R"({"mode": "static", "initial_power": 10})"));
  EXPECT_THAT(Error(R"({"fp16": {"enabled": true, "loss_scale": 1000}})"),
              HasSubstr("fp16.loss_scale: 1000 is not supported; write 0 (dynamic) or a power of two"));
  out = Translate(R"({"bf16": {"enabled": true, "check_grad_overflow": false}})");
  EXPECT_FALSE(out.contains("loss_scale"));
  out = Translate(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"},
                      "communication_data_type": "fp32"})");
  EXPECT_EQ(out["precision"], Json::parse(R"({"param": "bf16", "grad": "fp32", "reduce": "fp32"})"));
  EXPECT_THAT(Error(R"({"bf16": {"enabled": true}, "communication_data_type": "fp32"})"),
              HasSubstr("communication_data_type: ZeroRT reduces in the gradient accumulation dtype (bf16)"));
  EXPECT_THAT(Error(R"({"bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp16"}})"),
              HasSubstr("data_types.grad_accum_dtype: \"fp16\" is not supported with bf16 params"));
  EXPECT_THAT(Error(R"({"fp16": {"enabled": true, "consecutive_hysteresis": true}})"),
              HasSubstr("fp16.consecutive_hysteresis: true is not supported"));
}

TEST(DeepSpeedConfig, DeviceIsZeroRtsOwnKey) {
  // DeepSpeed always runs on its accelerator; ZeroRT's "device" passes through.
  EXPECT_EQ(Translate(R"({"zero_optimization": {"stage": 1}, "device": "cuda"})")["device"], "cuda");
  EXPECT_FALSE(Translate(R"({"zero_optimization": {"stage": 1}})").contains("device"));
  EXPECT_THAT(Error(R"({"zero_optimization": {"stage": 1}, "buckets": {"overlap": false}})"),
              HasSubstr("buckets: ZeroRT's own key in a config read as DeepSpeed's"));
}

TEST(DeepSpeedConfig, GuardIsZeroRtsOwnSection) {
  // No DeepSpeed key sets guard.on_duplicate (a weight shared under reentrant checkpointing) or
  // guard.timeout_s: ZeroRT's "guard" section passes through, beside ignore_unused_parameters.
  const Json out = Translate(R"({"zero_optimization": {"stage": 2, "ignore_unused_parameters": true},
                                 "guard": {"on_duplicate": "count", "timeout_s": 30}})");
  EXPECT_EQ(out["guard"], Json::parse(R"({"on_duplicate": "count", "timeout_s": 30, "on_unused": "zero"})"));
  EXPECT_THAT(Error(R"({"zero_optimization": {"ignore_unused_parameters": true}, "guard": {"on_unused": "zero"}})"),
              HasSubstr("keep one"));
  EXPECT_THAT(Error(R"({"zero_optimization": {"stage": 1}, "guard": 1})"), HasSubstr("guard: 1 is not an object"));
}

// A value ZeroRT's parser refuses is named by the key the user wrote, not only the one it was
// copied to.
TEST(DeepSpeedConfig, RefusedValuesNameTheDeepSpeedKey) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"zero_optimization": {"stage": "3"}})", R"(DeepSpeed key "zero_optimization.stage" (ZeroRT's "stage"))"},
      {R"({"gradient_clipping": "1.0"})", R"(DeepSpeed key "gradient_clipping" (ZeroRT's "clip_grad_norm"))"},
      {R"({"zero_optimization": {"reduce_bucket_size": -5}})",
       R"(DeepSpeed key "zero_optimization.reduce_bucket_size" (ZeroRT's "buckets.reduce_bucket_elems"))"},
      {R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.5]}}})",
       R"(DeepSpeed key "optimizer.params.betas[1]" (ZeroRT's "optimizer.betas[1]"))"},
  };
  for (const auto& [text, named] : cases) {
    EXPECT_THAT(Config::FromJson(text), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(named))) << text;
    EXPECT_THAT(NormalizeConfigJson(text), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(named))) << text;
  }
  EXPECT_EQ(NameDeepSpeedKeys(R"(config key "guard.timeout_s": bad)", {{"stage", "zero_optimization.stage"}}),
            R"(config key "guard.timeout_s": bad)")
      << "a key of no DeepSpeed origin stays as it was";
}

TEST(DeepSpeedConfig, NotesAreAppendedOnlyOnSuccess) {
  std::vector<std::string> notes = {"earlier"};
  ASSERT_THAT(TranslateDeepSpeedConfig(Json::parse(kZero2Bf16), &notes), IsOk());
  EXPECT_EQ(notes.front(), "earlier");
  EXPECT_GT(notes.size(), 6u);
  notes = {"earlier"};
  EXPECT_THAT(TranslateDeepSpeedConfig(Json::parse(R"({"amp": {"enabled": true}})"), &notes),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(notes, std::vector<std::string>{"earlier"});
}

TEST(DeepSpeedConfig, RecognisedByDeepSpeedOnlyKeys) {
  for (const char* text : {R"({"zero_optimization": {"stage": 2}})", R"({"train_batch_size": 8})",
                           R"({"train_micro_batch_size_per_gpu": 1})", R"({"fp16": {"enabled": true}})",
                           R"({"bf16": {"enabled": true}})", R"({"gradient_clipping": 1.0})",
                           R"({"optimizer": {"type": "Adam", "params": {"lr": 1e-3}}})",
                           R"({"checkpoint": {"tag_validation": "Warn"}})",
                           R"({"checkpoint": {"use_node_local_storage": true}, "scheduler": {"type": "WarmupLR"}})"}) {
    EXPECT_TRUE(IsDeepSpeedConfig(Json::parse(text))) << text;
  }
  // ZeroRT's own config (the one in include/zero/config.h), and keys both configs have.
  for (const char* text : {
           R"({"stage": 2, "device": "cpu",
               "optimizer": {"type": "adamw", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                             "weight_decay": 0.01, "momentum": 0.0, "dampening": 0.0, "nesterov": false},
               "precision": {"param": "fp32", "grad": "fp32", "reduce": "fp32", "master_weights": true},
               "buckets": {"reduce_bucket_elems": 4000000, "overlap": true, "pool_buffers": 4},
               "stage3": {"prefetch_elems": 50000000}, "gradient_accumulation_steps": 1,
               "clip_grad_norm": 0.0, "loss_scale": {"mode": "none"}, "guard": {"on_unused": "error"},
               "checkpoint": {"keep_last": 0},
               "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})",
           "{}", "[]", R"("zero_optimization")"}) {
    EXPECT_FALSE(IsDeepSpeedConfig(Json::parse(text))) << text;
  }
}

}  // namespace
}  // namespace zero::runtime
