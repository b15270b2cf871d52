// Inputs checked at the door: every numeric config key is range-checked when the JSON is parsed
// (the error names the key and quotes the value as written), what the parser accepts the
// kernels accept too (configs at the edges of every range still step), and ranks that
// registered different params learn both sides at Finalize, on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/engine/run_on_ranks.h"
#include "tests/engine/toy_trainer.h"
#include "tests/status_matchers.h"
#include "zero/communicator.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero {
namespace {

using ::testing::AllOf;
using ::testing::AllOfArray;
using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::IsOk;
using testing::StatusIs;

struct Rejected {
  std::string json;
  std::string key;     // as the message names it
  std::string quoted;  // the value as written
};

class ConfigRejects : public ::testing::TestWithParam<Rejected> {};

TEST_P(ConfigRejects, NamingTheKeyAndQuotingTheValue) {
  const Rejected& c = GetParam();
  const StatusOr<Config> config = Config::FromJson(c.json);
  ASSERT_THAT(config, Not(IsOk())) << c.json << " was accepted";
  EXPECT_THAT(config, StatusIs(absl::StatusCode::kInvalidArgument,
                               AllOf(HasSubstr("config key \"" + c.key + "\""), HasSubstr(c.quoted))));
  const std::string message(config.status().message());
  EXPECT_EQ(message.find("e+09"), std::string::npos) << "a converted value instead of the given one: " << message;
}

INSTANTIATE_TEST_SUITE_P(
    OutOfRange, ConfigRejects,
    ::testing::Values(
        // Used to fail only at the first Step, inside a kernel launcher.
        Rejected{R"({"optimizer": {"eps": 2e6}})", "optimizer.eps", "2e6"},
        // Used to keep the last value silently.
        Rejected{R"({"stage": 9, "stage": 2})", "stage", "appears twice"},
        Rejected{R"({"optimizer": {"lr": 1, "type": "sgd", "lr": 2}})", "optimizer.lr", "appears twice"},
        // Param groups and schedules name the element and the key.
        Rejected{R"({"optimizer": {"param_groups": [{}, {"lr": -1}]}})", "optimizer.param_groups[1].lr", "-1"},
        Rejected{R"({"optimizer": {"param_groups": [{"momentun": 0.9}]}})", "optimizer.param_groups[0].momentun",
                 "unknown key"},
        Rejected{R"({"optimizer": {"param_groups": [{"nesterov": true}]}})", "optimizer.param_groups[0].nesterov",
                 "momentum > 0"},
        Rejected{R"({"scheduler": {"type": "OneCycle"}})", "scheduler.type", "OneCycle"},
        Rejected{R"({"scheduler": {"type": "WarmupDecayLR"}})", "scheduler.params.total_num_steps", "required"},
        Rejected{R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 2e7}}})",
                 "scheduler.params.warmup_max_lr", "2e7"},
        Rejected{R"({"optimizer": {"eps": 0}})", "optimizer.eps", "0"},
        Rejected{R"({"optimizer": {"eps": 1e999}})", "optimizer.eps", "1e999"},
        Rejected{R"({"optimizer": {"lr": -1e999}})", "optimizer.lr", "-1e999"},
        Rejected{R"({"optimizer": {"lr": 2e6}})", "optimizer.lr", "2e6"},
        Rejected{R"({"optimizer": {"lr": -0.1}})", "optimizer.lr", "-0.1"},
        // Used to be converted to int first and quoted as -2.14748e+09.
        Rejected{R"({"stage": 3e9})", "stage", "3e9"},
        Rejected{R"({"stage": 9223372036854775807})", "stage", "9223372036854775807"},
        Rejected{R"({"buckets": {"reduce_bucket_elems": 1e30}})", "buckets.reduce_bucket_elems", "1e30"},
        Rejected{R"({"buckets": {"first_bucket_elems": 0}})", "buckets.first_bucket_elems", "0"},
        Rejected{R"({"buckets": {"last_bucket_elems": -1}})", "buckets.last_bucket_elems", "-1"},
        Rejected{R"({"buckets": {"pool_buffers": 3000000000}})", "buckets.pool_buffers", "3000000000"},
        // Integer keys take whole numbers only.
        Rejected{R"({"stage": 2.5})", "stage", "2.5"},
        Rejected{R"({"gradient_accumulation_steps": 1.5})", "gradient_accumulation_steps", "1.5"},
        Rejected{R"({"loss_scale": {"hysteresis": 2.25}})", "loss_scale.hysteresis", "2.25"},
        // A positive value that a float would store as 0 or a subnormal (lr 1e-300 became 0).
        Rejected{R"({"optimizer": {"lr": 1e-300}})", "optimizer.lr", "1e-300"},
        Rejected{R"({"optimizer": {"lr": 1e-40}})", "optimizer.lr", "1e-40"},
        Rejected{R"({"optimizer": {"lr": 1e-400}})", "optimizer.lr", "1e-400"},
        Rejected{R"({"optimizer": {"weight_decay": 1e-45}})", "optimizer.weight_decay", "1e-45"},
        Rejected{R"({"guard": {"timeout_s": 1e-310}})", "guard.timeout_s", "1e-310"},
        // Used to be accepted, then std::bad_alloc.
        Rejected{R"({"guard": {"timeout_s": 1e10}})", "guard.timeout_s", "1e10"},
        Rejected{R"({"guard": {"timeout_s": 604800.5}})", "guard.timeout_s", "604800.5"},
        Rejected{R"({"guard": {"timeout_s": -1}})", "guard.timeout_s", "-1"},
        // Betas: each element named; rounding to 1 as a float counts.
        Rejected{R"({"optimizer": {"betas": [0.9, 1.0]}})", "optimizer.betas[1]", "1.0"},
        Rejected{R"({"optimizer": {"betas": [-0.1, 0.9]}})", "optimizer.betas[0]", "-0.1"},
        Rejected{R"({"optimizer": {"betas": [0.9, 0.99999999999]}})", "optimizer.betas[1]", "0.99999999999"},
        Rejected{R"({"optimizer": {"betas": [0.9, 1e999]}})", "optimizer.betas[1]", "1e999"},
        Rejected{R"({"optimizer": {"betas": [0.9]}})", "optimizer.betas", "[0.9]"},
        Rejected{R"({"optimizer": {"weight_decay": -0.01}})", "optimizer.weight_decay", "-0.01"},
        Rejected{R"({"optimizer": {"weight_decay": 1e7}})", "optimizer.weight_decay", "1e7"},
        Rejected{R"({"optimizer": {"momentum": 1.5}})", "optimizer.momentum", "1.5"},
        Rejected{R"({"optimizer": {"dampening": -1}})", "optimizer.dampening", "-1"},
        Rejected{R"({"clip_grad_norm": -1})", "clip_grad_norm", "-1"},
        Rejected{R"({"clip_grad_norm": 1e39})", "clip_grad_norm", "1e39"},
        Rejected{R"({"sync_grad_norm": 0})", "sync_grad_norm", "0"},
        Rejected{R"({"gradient_accumulation_steps": 0})", "gradient_accumulation_steps", "0"},
        Rejected{R"({"loss_scale": {"min": 0}})", "loss_scale.min", "0"},
        Rejected{R"({"loss_scale": {"min": 1e20}})", "loss_scale.min", "1e20"},
        Rejected{R"({"loss_scale": {"initial_power": 65}})", "loss_scale.initial_power", "65"},
        Rejected{R"({"loss_scale": {"window": 0}})", "loss_scale.window", "0"},
        Rejected{R"({"stage3": {"max_live_elems": 0}})", "stage3.max_live_elems", "0"},
        Rejected{R"({"stage3": {"prefetch_elems": -1}})", "stage3.prefetch_elems", "-1"},
        Rejected{R"({"stage3": {"persistence_threshold": 1e16}})", "stage3.persistence_threshold", "1e16"},
        Rejected{R"({"stage3": {"max_reuse_elems": -1}})", "stage3.max_reuse_elems", "-1"},
        Rejected{R"({"guard": {"replica_check_every": -1}})", "guard.replica_check_every", "-1"},
        // Wrong types quote the value too.
        Rejected{R"({"optimizer": {"lr": "fast"}})", "optimizer.lr", "\"fast\""},
        Rejected{R"({"guard": {"consistency_check": 1}})", "guard.consistency_check", "1"},
        // Hugging Face's "auto" in ZeroRT's own keys says who fills it in.
        Rejected{R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}}})",
                 "scheduler.params.warmup_max_lr", "Hugging Face"},
        // A schedule's params without its type would do nothing.
        Rejected{R"({"scheduler": {"params": {"warmup_max_lr": 0.5}}})", "scheduler", "no \"type\""}));

TEST(ConfigJson, TextThatIsNotJsonSaysWhere) {
  const StatusOr<Config> config = Config::FromJson("{\"stage\": 2,\n \"device\": cpu}");
  EXPECT_THAT(config,
              StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("not valid JSON"), HasSubstr("line 2"))));
}

// Empty text is more often a config file that failed to load than a choice of defaults.
TEST(ConfigJson, EmptyTextIsRefusedAndBracesGiveTheDefaults) {
  for (const char* empty : {"", "  \n"}) {
    EXPECT_THAT(Config::FromJson(empty), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
    EXPECT_THAT(NormalizeConfigJson(empty), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  }
  EXPECT_THAT(Config::FromJson("{}"), IsOk());
}

TEST(ConfigJson, EachOptimizerTypeHasPyTorchsDefaultWeightDecay) {
  const std::vector<std::pair<std::string, float>> defaults = {
      {"adamw", 0.01f}, {"adam", 0.0f}, {"sgd", 0.0f}, {"lamb", 0.0f}, {"lion", 0.0f}};
  for (const auto& [type, decay] : defaults) {
    SCOPED_TRACE(type);
    const StatusOr<Config> plain = Config::FromJson(R"({"optimizer": {"type": ")" + type + R"("}})");
    ASSERT_THAT(plain, IsOk());
    EXPECT_EQ(plain->optimizer.weight_decay, decay);
    const StatusOr<Config> set =
        Config::FromJson(R"({"optimizer": {"type": ")" + type + R"(", "weight_decay": 0.25}})");
    ASSERT_THAT(set, IsOk());
    EXPECT_EQ(set->optimizer.weight_decay, 0.25f);
  }
  const StatusOr<Config> none = Config::FromJson("{}");
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->optimizer.weight_decay, 0.01f) << "the default type is adamw";
}

TEST(ConfigJson, AcceptsTheEdgesOfEveryRange) {
  const StatusOr<Config> config = Config::FromJson(R"({
      "stage": 3.0,
      "optimizer": {"lr": 1e6, "betas": [0, 0.99999994], "eps": 1, "weight_decay": 1e6,
                    "momentum": 1, "dampening": 0},
      "buckets": {"reduce_bucket_elems": 1e15, "first_bucket_elems": 1, "last_bucket_elems": 0,
                  "pool_buffers": 2147483647, "grow_pool": false},
      "stage3": {"prefetch_elems": 0, "max_live_elems": 1e15, "persistence_threshold": 0,
                 "max_reuse_elems": 0},
      "gradient_accumulation_steps": 2147483647, "clip_grad_norm": 3.4028234e38,
      "loss_scale": {"initial_power": 64, "window": 1, "hysteresis": 1, "min": 1.8446744073709552e19},
      "guard": {"timeout_s": 604800, "replica_check_every": 0}})");
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->stage, 3);
  EXPECT_EQ(config->buckets.reduce_bucket_elems, int64_t{1'000'000'000'000'000});
  EXPECT_EQ(config->buckets.last_bucket_elems, 0);
  EXPECT_FALSE(config->buckets.grow_pool);
  EXPECT_EQ(config->stage3.max_reuse_elems, 0);
  EXPECT_FLOAT_EQ(config->optimizer.beta2, 0.99999994f);
  EXPECT_DOUBLE_EQ(config->guard.timeout_s, 604800);
  const StatusOr<Config> smallest = Config::FromJson(
      R"({"optimizer": {"lr": 1.17549435e-38, "eps": 1.17549435e-38, "weight_decay": 0}, "guard": {"timeout_s": 0}})");
  ASSERT_THAT(smallest, IsOk());
  EXPECT_EQ(smallest->optimizer.lr, std::numeric_limits<float>::min());
}

// Values set in C++ (no JSON) go through the same ranges in Validate, NaN and Inf included.
TEST(ConfigValidate, RejectsNonFiniteAndSubnormalValuesNamingTheKey) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::function<void(Config&)> set;
    std::string key;
  };
  const std::vector<Case> cases = {
      {[&](Config& c) { c.optimizer.lr = nan; }, "optimizer.lr"},
      {[&](Config& c) { c.optimizer.lr = 1e-40f; }, "optimizer.lr"},
      {[&](Config& c) { c.optimizer.eps = inf; }, "optimizer.eps"},
      {[&](Config& c) { c.optimizer.beta1 = nan; }, "optimizer.betas[0]"},
      {[&](Config& c) { c.optimizer.weight_decay = inf; }, "optimizer.weight_decay"},
      {[&](Config& c) { c.clip_grad_norm = nan; }, "clip_grad_norm"},
      {[&](Config& c) { c.loss_scale.min = inf; }, "loss_scale.min"},
      {[&](Config& c) { c.guard.timeout_s = std::numeric_limits<double>::infinity(); }, "guard.timeout_s"},
      {[&](Config& c) { c.guard.timeout_s = 1e10; }, "guard.timeout_s"},
      {[&](Config& c) { c.buckets.reduce_bucket_elems = std::numeric_limits<int64_t>::max(); },
       "buckets.reduce_bucket_elems"},
  };
  for (const Case& c : cases) {
    Config config;
    c.set(config);
    EXPECT_THAT(config.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"" + c.key + "\"")))
        << c.key;
  }
  EXPECT_THAT(Config().Validate(), IsOk());
}

// A C++ caller may store any int in an enum field: one that is none of its choices is refused
// naming the key (it would otherwise act as some default, or fail every Step).
TEST(ConfigValidate, RejectsEnumFieldsHoldingNoneOfTheirChoices) {
  struct Case {
    std::function<void(Config&)> set;
    std::string key;
  };
  const std::vector<Case> cases = {
      {[](Config& c) { c.device = static_cast<Device>(9); }, "device"},
      {[](Config& c) { c.optimizer.type = static_cast<OptimizerType>(42); }, "optimizer.type"},
      {[](Config& c) { c.optimizer.type = static_cast<OptimizerType>(-1); }, "optimizer.type"},
      {[](Config& c) { c.scheduler.type = static_cast<LrScheduleType>(9); }, "scheduler.type"},
      {[](Config& c) { c.scheduler.warmup_type = static_cast<WarmupType>(2); }, "scheduler.params.warmup_type"},
      {[](Config& c) { c.precision.param = DType::kUInt8; }, "precision.param"},
      {[](Config& c) { c.precision.grad = DType::kInt64; }, "precision.grad"},
      {[](Config& c) { c.precision.reduce = static_cast<DType>(7); }, "precision.reduce"},
      {[](Config& c) { c.loss_scale.mode = static_cast<LossScaleMode>(7); }, "loss_scale.mode"},
      {[](Config& c) { c.guard.on_duplicate = static_cast<DuplicatePolicy>(5); }, "guard.on_duplicate"},
      {[](Config& c) { c.guard.on_unused = static_cast<UnusedPolicy>(2); }, "guard.on_unused"},
      {[](Config& c) { c.guard.init_params = static_cast<InitParams>(5); }, "guard.init_params"},
  };
  for (const Case& c : cases) {
    Config config;
    c.set(config);
    EXPECT_THAT(config.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"" + c.key + "\"")))
        << c.key;
  }
  Config every_last;
  every_last.device = Device::kCuda;
  every_last.optimizer.type = OptimizerType::kLion;
  every_last.precision.param = DType::kFP16;
  every_last.guard.on_unused = UnusedPolicy::kZero;
  EXPECT_THAT(every_last.Validate(), IsOk());
}

// Trains the toy model a few steps on two in-process ranks; every rank's status.
std::vector<Status> TrainTwoRanks(const Config& config) {
  return testing::RunOnRanks(2, [&](int, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
    testing::ToyOptions options;
    options.steps = 3;
    testing::ToyResult result;
    return testing::TrainToy(*engine, options, &result);
  });
}

// What FromJson accepts, the kernels accept: the defaults of every optimizer at every stage,
// and each optimizer at the extremes of its ranges.
TEST(ConfigSteps, EveryAcceptedConfigSteps) {
  const std::vector<std::string> optimizers = {"adam", "adamw", "sgd", "lamb", "lion"};
  std::vector<std::string> configs;
  for (const std::string& type : optimizers) {
    for (int stage = 0; stage <= 3; ++stage) {
      configs.push_back(absl::StrCat(R"({"stage": )", stage, R"(, "optimizer": {"type": ")", type, R"("}})"));
    }
    configs.push_back(absl::StrCat(R"({"optimizer": {"type": ")", type, R"(", "lr": 1e6, "eps": 1,
        "weight_decay": 1e6, "betas": [0, 0.99999994], "momentum": 1, "dampening": 1},
        "clip_grad_norm": 3.4028234e38, "guard": {"timeout_s": 604800},
        "loss_scale": {"mode": "dynamic", "initial_power": 64, "min": 1.8446744073709552e19}})"));
    configs.push_back(absl::StrCat(R"({"optimizer": {"type": ")", type, R"(", "lr": 1.17549435e-38,
        "eps": 1.17549435e-38, "weight_decay": 0, "betas": [0.5, 0], "momentum": 0.9},
        "clip_grad_norm": 1.17549435e-38, "guard": {"timeout_s": 0},
        "loss_scale": {"mode": "static", "initial_power": 0, "min": 1.17549435e-38}})"));
  }
  for (const std::string& json : configs) {
    SCOPED_TRACE(json);
    const StatusOr<Config> config = Config::FromJson(json);
    ASSERT_THAT(config, IsOk());
    EXPECT_THAT(TrainTwoRanks(*config), Each(IsOk()));
  }
}

// Each rank registers `specs`, then Finalize; returns each rank's Finalize status.
std::vector<Status> FinalizeOnRanks(const std::vector<std::vector<ParamSpec>>& specs,
                                    const std::vector<int>& stages = {}, const std::vector<float>& lrs = {}) {
  return testing::RunOnRanks(static_cast<int>(specs.size()), [&](int r, comm::Communicator& comm) -> Status {
    Config config;
    config.guard.timeout_s = 60;
    if (!stages.empty()) config.stage = stages[r];
    if (!lrs.empty()) config.optimizer.lr = lrs[r];
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
    for (const ParamSpec& spec : specs[r]) ZERO_RETURN_IF_ERROR(engine->RegisterParam(spec).status());
    return engine->Finalize();
  });
}

void ExpectEveryRankSays(const std::vector<Status>& statuses, const std::vector<std::string>& parts) {
  std::vector<::testing::Matcher<std::string>> says;
  for (const std::string& part : parts) says.push_back(HasSubstr(part));
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_THAT(statuses[r], StatusIs(absl::StatusCode::kInvalidArgument, AllOfArray(says))) << "rank " << r;
  }
}

TEST(RegistryMismatch, EveryRankNamesBothSides) {
  const ParamSpec embed{"embed.weight", {16, 8}}, lora{"block.0.lora_B.weight", {8, 8}};
  ExpectEveryRankSays(FinalizeOnRanks({{embed, lora}, {lora, embed}}),
                      {"param index 0", "rank 0 has \"embed.weight\" [16, 8] fp32",
                       "rank 1 has \"block.0.lora_B.weight\" [8, 8] fp32"});
}

TEST(RegistryMismatch, GroupsRanksAndShowsWhatDiffers) {
  const ParamSpec a{"a", {4}}, b{"b", {4}}, frozen{"b", {4}, DType::kFP32, false, 1, 2};
  ExpectEveryRankSays(FinalizeOnRanks({{a, b}, {a, b}, {a, frozen}, {a, b}}),
                      {"param index 1", "ranks 0-1, 3 have \"b\" [4] fp32,",
                       "rank 2 has \"b\" [4] fp32 frozen group 1 unit 2"});
}

TEST(RegistryMismatch, ARankWithFewerParamsHasNothingThere) {
  const ParamSpec a{"a", {4}}, b{"b", {2, 3}};
  ExpectEveryRankSays(FinalizeOnRanks({{a, b}, {a}}), {"param index 1", "rank 0 has \"b\" [2, 3] fp32",
                                                       "rank 1 has nothing (it registered only 1 param)"});
}

// Names are cut to a fixed length, never inside a UTF-8 character (€ is three bytes).
TEST(RegistryMismatch, LongNamesAreCut) {
  std::string euros;
  for (int i = 0; i < 400; ++i) euros += "€";
  const ParamSpec a{std::string(1000, 'x'), {4}}, b{euros, {4}};
  const std::vector<Status> statuses = FinalizeOnRanks({{a}, {b}});
  ExpectEveryRankSays(statuses, {"param index 0", "rank 0 has \"xxxx", "rank 1 has \"€€€", "x…\" [4] fp32",
                                 "€…\" [4] fp32"});
  EXPECT_LT(statuses[0].message().size(), 1000u) << statuses[0];
}

TEST(RegistryMismatch, DifferentStagesAreNamed) {
  const ParamSpec a{"a", {4}};
  ExpectEveryRankSays(FinalizeOnRanks({{a}, {a}, {a}}, {2, 1, 2}),
                      {"different ZeRO stages", "ranks 0, 2 have stage 2", "rank 1 has stage 1"});
}

// Ranks launched with different optimizer settings (an MPMD launch, a config read per rank)
// would each step their shard their own way: refused, naming both sides.
TEST(RegistryMismatch, DifferentOptimizerSettingsAreNamed) {
  const ParamSpec a{"a", {4}};
  ExpectEveryRankSays(FinalizeOnRanks({{a}, {a}, {a}}, {}, {0.001f, 0.002f, 0.001f}),
                      {"different optimizer settings", "ranks 0, 2 have adamw lr 0.001", "rank 1 has adamw lr 0.002"});
}

// Config values that shape the collectives (bucket sizes, the guard's policies, stage 3's
// window): a rank with another value would make other collectives, or the same ones at other
// points (guard.on_unused hung both ranks until guard.timeout_s). Refused at Finalize, naming
// the key and both sides.
TEST(RegistryMismatch, DifferentCollectiveSettingsNameTheKey) {
  auto finalize = [](const std::function<void(int, Config&)>& differ) {
    return testing::RunOnRanks(3, [&](int r, comm::Communicator& comm) -> Status {
      Config config;
      config.guard.timeout_s = 60;
      differ(r, config);
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
      ZERO_RETURN_IF_ERROR(engine->RegisterParam({"a", {4}}).status());
      return engine->Finalize();
    });
  };
  ExpectEveryRankSays(finalize([](int r, Config& c) {
                        if (r == 1) c.guard.on_unused = UnusedPolicy::kZero;
                      }),
                      {"config key guard.on_unused", "ranks 0, 2 have \"error\"", "rank 1 has \"zero\""});
  ExpectEveryRankSays(finalize([](int r, Config& c) { c.buckets.reduce_bucket_elems = 1000 * (r + 1); }),
                      {"config key buckets.reduce_bucket_elems", "rank 0 has 1000", "rank 2 has 3000"});
  ExpectEveryRankSays(finalize([](int r, Config& c) {
                        c.stage = 3;
                        if (r == 2) c.stage3.persistence_threshold = 0;
                      }),
                      {"config key stage3.persistence_threshold", "ranks 0-1 have 100000", "rank 2 has 0"});
  EXPECT_THAT(finalize([](int, Config& c) { c.guard.timeout_s = 30; }), Each(IsOk()));
  // Values the stage does not read: stage 3's window at stage 2, bucket caps and replica checks
  // at stage 3 (a bucket is a unit there, and no param is a replica).
  EXPECT_THAT(finalize([](int r, Config& c) {
                c.stage = 2;
                c.stage3.persistence_threshold = r;
              }),
              Each(IsOk()));
  EXPECT_THAT(finalize([](int r, Config& c) {
                c.stage = 3;
                c.buckets.reduce_bucket_elems = 1000 * (r + 1);
                c.guard.replica_check_every = r;
              }),
              Each(IsOk()));
}

TEST(RegistryMismatch, AgreeingRanksFinalize) {
  const ParamSpec a{"a", {4}}, b{"b", {3, 5}};
  EXPECT_THAT(FinalizeOnRanks({{a, b}, {a, b}, {a, b}}), Each(IsOk()));
}

TEST(ConfigJson, RoundTripAndErrorsNameTheKey) {
  auto config = Config::FromJson(R"({"stage": 1, "optimizer": {"type": "sgd", "lr": 0.1,
      "momentum": 0.9}, "buckets": {"reduce_bucket_elems": 1000}, "guard": {"timeout_s": 5}})");
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->stage, 1);
  EXPECT_EQ(config->optimizer.type, OptimizerType::kSgd);
  EXPECT_FLOAT_EQ(config->optimizer.momentum, 0.9f);
  EXPECT_EQ(config->buckets.reduce_bucket_elems, 1000);
  EXPECT_TRUE(config->sync_grad_norm);
  auto lazy = Config::FromJson(R"({"sync_grad_norm": false})");
  ASSERT_THAT(lazy, IsOk());
  EXPECT_FALSE(lazy->sync_grad_norm);
  auto unknown = Config::FromJson(R"({"buckets": {"reduce_bucket_size": 5}})");
  EXPECT_NE(unknown.status().message().find("buckets.reduce_bucket_size"), std::string::npos) << unknown.status();
  auto range = Config::FromJson(R"({"stage": 5})");
  EXPECT_NE(range.status().message().find("\"stage\""), std::string::npos) << range.status();
  auto type = Config::FromJson(R"({"optimizer": {"lr": "fast"}})");
  EXPECT_NE(type.status().message().find("optimizer.lr"), std::string::npos) << type.status();
  auto choice = Config::FromJson(R"({"optimizer": {"type": "adagrad"}})");
  EXPECT_NE(choice.status().message().find("adagrad"), std::string::npos) << choice.status();
  EXPECT_THAT(Config::FromJson("{not json"), Not(IsOk()));
}

}  // namespace
}  // namespace zero
