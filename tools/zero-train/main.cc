// zero-train: ZeroRT's main job and the reference example of embedding it. Trains an MLP on a
// synthetic teacher-student task, data-parallel over in-process ranks (default) or, launched by
// mpirun, one rank per process on the MPI communicator. Rank 0 reports: a live progress line
// on a terminal, plain lines otherwise, one JSON object per step with --json and a summary.
//
//   zero-train                                   # 4 in-process ranks, stage 2, AdamW
//   zero-train --stage 3 --ranks 8 --precision bf16 --steps 500
//   mpirun -np 4 zero-train --json > run.jsonl
//   zero-train --config zero.json --lr 3e-3      # flags given on the command line win
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/command_line.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "flag_agreement.h"
#include "mlp.h"
#include "report.h"
#include "zero/communicator.h"
#include "zero/engine.h"
#include "zero/preemption.h"

ABSL_FLAG(int, ranks, 4, "in-process ranks, 1-1024 (under mpirun every process is one rank instead)");
ABSL_FLAG(int, stage, 2, "ZeRO stage: 0 (data parallel), 1, 2 or 3");
ABSL_FLAG(std::string, optimizer, "adamw", "adamw, adam, sgd, lion or lamb");
ABSL_FLAG(double, lr, 2e-3, "learning rate");
ABSL_FLAG(double, weight_decay, 0.01, "weight decay");
ABSL_FLAG(std::string, lr_schedule, "none",
          "none, or DeepSpeed's WarmupLR, WarmupDecayLR or WarmupCosineLR (linear warmup over "
          "--warmup_steps to --lr; the decays end at --steps)");
ABSL_FLAG(int, warmup_steps, 10, "warmup steps of --lr_schedule (or of the schedule of --config)");
ABSL_FLAG(std::string, precision, "fp32",
          "params and gradients: fp32, bf16 or fp16 (16-bit keep fp32 master weights; fp16 adds dynamic loss scaling)");
ABSL_FLAG(int, steps, 100, "optimizer steps (≥ 1; with --resume, the total including those already done)");
ABSL_FLAG(int64_t, reduce_bucket_elems, 4'000'000, "elements per gradient bucket");
ABSL_FLAG(int64_t, first_bucket_elems, 1'000'000, "elements in the first bucket");
ABSL_FLAG(int, accumulation, 1, "micro-batches per optimizer step (gradient_accumulation_steps)");
ABSL_FLAG(double, clip, 0.0, "clip the global gradient norm to this (0: off)");
ABSL_FLAG(uint64_t, seed, 1, "seed of data, teacher and initial weights");
ABSL_FLAG(std::string, config, "", "a JSON config (DESIGN.md keys); flags given on the command line override it");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(bool, json, false, "one JSON object per step on stdout, then a summary object");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "where to save checkpoints: DIR/step-N (each rank its shard; loads at any rank count), DIR/latest "
          "names the newest; without --save_every, one after the last step. SIGTERM or SIGUSR1 saves one at "
          "the next step boundary and exits 0");
ABSL_FLAG(int, save_every, 0,
          "save a checkpoint every N steps (and after the last) into --checkpoint_dir; 0: after the last only");
ABSL_FLAG(int, keep_last, 2,
          "keep the newest N checkpoints in --checkpoint_dir (0: all; a --config that sets "
          "checkpoint.keep_last keeps its value unless this flag is given)");
ABSL_FLAG(bool, resume, false,
          "continue from the newest checkpoint in --checkpoint_dir (an absent or empty directory starts at "
          "step 0; one holding no loadable checkpoint is an error)");
ABSL_FLAG(int, depth, 4, "hidden layers (≥ 1; depth × width² ≤ 1e9)");
ABSL_FLAG(int, width, 64, "layer width (≥ 1)");
ABSL_FLAG(int, batch, 16,
          "samples per rank per step (≥ --accumulation; a --config with train_micro_batch_size_per_gpu sets "
          "it to that × --accumulation)");
ABSL_FLAG(bool, tied, false, "tie the output projection to layer0.weight (its gradient arrives twice)");
ABSL_FLAG(bool, branch, false, "a branch used on even steps only (no rank uses it on odd steps)");
ABSL_FLAG(bool, recompute, false, "re-fire the middle layer's gradient as reentrant checkpointing does");

namespace zero::tools {
namespace {

using Json = nlohmann::json;

constexpr int kMaxRanks = 1024;          // in-process ranks are threads
constexpr double kMaxModelParams = 1e9;  // depth × width², fp32 copies on every rank

// The flags given on the command line, each with its value as written ("--lr=3e-3" and "--lr
// 3e-3" give {"lr", "3e-3"}; "--json" and "--nojson" give {"json", ""}), so that they override
// a --config file while the others keep the file's values, and so that errors quote them.
// (Debian's abseil keeps CommandLineFlag::IsSpecifiedOnCommandLine private.)
using GivenFlags = std::map<std::string, std::string>;

GivenFlags FindGivenFlags(int argc, char** argv) {
  GivenFlags given;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg = arg.substr(arg.find_first_not_of('-'));
    const size_t equals = arg.find('=');
    std::string name = arg.substr(0, equals), value;
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && name.rfind("no", 0) == 0) name = name.substr(2);
    if (equals != std::string::npos) {
      value = arg.substr(equals + 1);
    } else if (flag != nullptr && !flag->IsOfType<bool>() && i + 1 < argc) {
      value = argv[++i];
    }
    given[name] = value;
  }
  return given;
}

// Each config flag and the config keys it sets.
struct ConfigFlag {
  const char* flag;
  const char* keys[3];  // unused entries are null
};
constexpr ConfigFlag kConfigFlags[] = {
    {"stage", {"stage"}},
    {"device", {"device"}},
    {"optimizer", {"optimizer.type"}},
    {"lr", {"optimizer.lr"}},
    {"weight_decay", {"optimizer.weight_decay"}},
    {"lr_schedule", {"scheduler.type"}},
    {"warmup_steps", {"scheduler.params.warmup_num_steps"}},
    {"precision", {"precision.param", "precision.grad", "precision.reduce"}},
    {"reduce_bucket_elems", {"buckets.reduce_bucket_elems"}},
    {"first_bucket_elems", {"buckets.first_bucket_elems"}},
    {"accumulation", {"gradient_accumulation_steps"}},
    {"clip", {"clip_grad_norm"}},
    {"keep_last", {"checkpoint.keep_last"}}};

// A config error about a key that a given flag set names the flag and its value as written.
Status NameTheFlag(const Status& status, const GivenFlags& given) {
  const std::string message(status.message());
  for (const ConfigFlag& config_flag : kConfigFlags) {
    auto it = given.find(config_flag.flag);
    if (it == given.end()) continue;
    for (const char* key : config_flag.keys) {
      if (key == nullptr || message.find(absl::StrCat("\"", key, "\"")) == std::string::npos) continue;
      return Status(status.code(), absl::StrCat("--", config_flag.flag, " ", it->second, ": ", message));
    }
  }
  return status;
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat("--config ", path, " is a directory; name a JSON file"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read --config ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The config as JSON: --config's (checked alone first, so that its errors name the file), then
// the config flags given on the command line (without --config, every config flag's value).
// Flag values are JSON values, never JSON text.
StatusOr<Json> ConfigJson(const GivenFlags& given) {
  const std::string path = absl::GetFlag(FLAGS_config);
  Json json = Json::object();
  if (!path.empty()) {
    ZERO_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
    // A DeepSpeed config becomes ZeroRT's JSON first, so the flags below override its keys.
    const StatusOr<std::string> normalized = NormalizeConfigJson(text);
    if (!normalized.ok()) {
      return Status(normalized.status().code(), absl::StrCat("--config ", path, ": ", normalized.status().message()));
    }
    json = Json::parse(*normalized, nullptr, /*allow_exceptions=*/false);
  } else {
    json["guard"]["timeout_s"] = 120;  // a rank that fails alone must not keep the others for 10 min
  }
  auto use = [&path, &given](const char* flag) { return path.empty() || given.count(flag) > 0; };
  if (use("stage")) json["stage"] = absl::GetFlag(FLAGS_stage);
  if (use("device")) json["device"] = absl::GetFlag(FLAGS_device);
  if (use("optimizer")) json["optimizer"]["type"] = absl::GetFlag(FLAGS_optimizer);
  if (use("lr")) json["optimizer"]["lr"] = absl::GetFlag(FLAGS_lr);
  if (use("weight_decay")) json["optimizer"]["weight_decay"] = absl::GetFlag(FLAGS_weight_decay);
  const std::string schedule = absl::GetFlag(FLAGS_lr_schedule);
  const auto scheduler = json.find("scheduler");
  const bool config_schedules = given.count("lr_schedule") == 0 && scheduler != json.end() && scheduler->is_object();
  if (given.count("warmup_steps") > 0 && config_schedules) {  // the --config's schedule warms up so long
    json["scheduler"]["params"]["warmup_num_steps"] = absl::GetFlag(FLAGS_warmup_steps);
  } else if (given.count("warmup_steps") > 0 && (given.count("lr_schedule") == 0 || schedule == "none")) {
    return absl::InvalidArgumentError(
        "--warmup_steps needs --lr_schedule (WarmupLR, WarmupDecayLR or WarmupCosineLR), or a --config with a "
        "scheduler");
  }
  if (given.count("lr_schedule") > 0 && schedule != "none") {
    Json& params = json["scheduler"]["params"];
    json["scheduler"]["type"] = schedule;
    params["warmup_type"] = "linear";
    params["warmup_num_steps"] = absl::GetFlag(FLAGS_warmup_steps);
    if (schedule != "WarmupCosineLR") {  // the optimizer's lr (DeepSpeed's default 1e-3 without one)
      const auto optimizer = json.find("optimizer");
      const bool has_lr = optimizer != json.end() && optimizer->is_object() && optimizer->contains("lr");
      params["warmup_max_lr"] = has_lr ? (*optimizer)["lr"] : Json(1e-3);
    }
    if (schedule != "WarmupLR") params["total_num_steps"] = absl::GetFlag(FLAGS_steps);
  }
  if (use("precision")) {
    const std::string dtype = absl::GetFlag(FLAGS_precision);
    for (const char* key : {"param", "grad", "reduce"}) json["precision"][key] = dtype;
    if (dtype == "fp16") json["loss_scale"]["mode"] = "dynamic";
  }
  if (use("reduce_bucket_elems")) json["buckets"]["reduce_bucket_elems"] = absl::GetFlag(FLAGS_reduce_bucket_elems);
  if (use("first_bucket_elems")) json["buckets"]["first_bucket_elems"] = absl::GetFlag(FLAGS_first_bucket_elems);
  if (use("accumulation")) json["gradient_accumulation_steps"] = absl::GetFlag(FLAGS_accumulation);
  if (use("clip")) json["clip_grad_norm"] = absl::GetFlag(FLAGS_clip);
  // --keep_last's default holds unless --config (as translated: a DeepSpeed config's own
  // "checkpoint" section is not ZeroRT's, and is dropped there) sets checkpoint.keep_last.
  const auto section = json.find("checkpoint");
  const bool config_keeps = section != json.end() && section->is_object() && section->contains("keep_last");
  if (use("keep_last") || !config_keeps) json["checkpoint"]["keep_last"] = absl::GetFlag(FLAGS_keep_last);
  // The model's optional patterns need the guard policies that handle them.
  if (absl::GetFlag(FLAGS_tied) || absl::GetFlag(FLAGS_recompute)) json["guard"]["on_duplicate"] = "count";
  if (absl::GetFlag(FLAGS_branch)) json["guard"]["on_unused"] = "zero";
  return json;
}

StatusOr<Config> BuildConfig(const GivenFlags& given) {
  // NaN and ±Inf have no JSON form (dump() would write null): refused here, by flag.
  const std::pair<const char*, double> reals[] = {{"lr", absl::GetFlag(FLAGS_lr)},
                                                   {"weight_decay", absl::GetFlag(FLAGS_weight_decay)},
                                                   {"clip", absl::GetFlag(FLAGS_clip)}};
  for (const auto& [flag, value] : reals) {
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", value, ": not a finite number"));
    }
  }
  ZERO_ASSIGN_OR_RETURN(const Json json, ConfigJson(given));
  StatusOr<Config> config = Config::FromJson(json.dump());
  if (!config.ok()) return NameTheFlag(config.status(), given);
  return config;
}

// The tool's own numeric flags (the config's are checked by Config::FromJson).
Status CheckToolFlags(int accumulation) {
  auto bad = [](const char* flag, auto value, const char* allowed) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", value, ": allowed: ", allowed));
  };
  const int ranks = absl::GetFlag(FLAGS_ranks), steps = absl::GetFlag(FLAGS_steps);
  const int save_every = absl::GetFlag(FLAGS_save_every);
  const int depth = absl::GetFlag(FLAGS_depth), width = absl::GetFlag(FLAGS_width), batch = absl::GetFlag(FLAGS_batch);
  if (ranks < 1 || ranks > kMaxRanks) return bad("ranks", ranks, "1 to 1024 in-process ranks");
  if (steps < 1) return bad("steps", steps, "≥ 1");
  if (save_every < 0) return bad("save_every", save_every, "≥ 0 (0: one checkpoint after the last step)");
  if (depth < 1) return bad("depth", depth, "≥ 1");
  if (width < 1) return bad("width", width, "≥ 1");
  if (batch < accumulation) return bad("batch", batch, "≥ --accumulation (every micro-batch needs a sample)");
  if (double(depth) * width * width > kMaxModelParams) {
    return absl::InvalidArgumentError(absl::StrCat("--depth ", depth, " --width ", width,
                                                   ": the model would have depth × width² > 1e9 params"));
  }
  const std::string checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  const bool checkpoints = !checkpoint_dir.empty();
  std::error_code error;
  if (checkpoints && std::filesystem::exists(checkpoint_dir, error) &&
      !std::filesystem::is_directory(checkpoint_dir, error)) {  // refused before any step, not at the first save
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_dir ", checkpoint_dir, " is not a directory; name a directory (created if absent)"));
  }
  // A series of an earlier run there: training from step 0 would prune its checkpoints
  // (keep_last counts this run's saves as the newest), so it is never started by accident.
  if (checkpoints && !absl::GetFlag(FLAGS_resume) &&
      std::filesystem::exists(std::filesystem::path(checkpoint_dir) / "latest", error)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--checkpoint_dir ", checkpoint_dir, " holds the checkpoints of an earlier run (", checkpoint_dir,
        "/latest): pass --resume to continue it, or name another (or an empty) directory; a run from step 0 "
        "there would replace its checkpoints"));
  }
  // A directory the saves cannot write (a read-only file system, another user's) is found
  // now, not after the steps before the first save.
  if (checkpoints && (!std::filesystem::create_directories(checkpoint_dir, error) && error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_dir ", checkpoint_dir, " cannot be created: ", error.message()));
  }
  if (checkpoints && ::access(checkpoint_dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--checkpoint_dir ", checkpoint_dir,
                                                   " is not writable: ", std::strerror(errno),
                                                   "; the checkpoints could not be saved there"));
  }
  if (save_every > 0 && !checkpoints) return absl::InvalidArgumentError("--save_every needs --checkpoint_dir");
  if (absl::GetFlag(FLAGS_resume) && !checkpoints) return absl::InvalidArgumentError("--resume needs --checkpoint_dir");
  return absl::OkStatus();
}

// Collects every rank's peak bytes on rank 0.
StatusOr<std::vector<RankMemory>> GatherMemory(comm::Communicator& comm, const Engine& engine, double timeout_s) {
  const MemoryStats stats = engine.GetMemoryStats();
  std::vector<int64_t> mine(stats.peak.begin(), stats.peak.end()), all(mine.size() * comm.size());
  ZERO_RETURN_IF_ERROR(comm.AllGather(mine.data(), all.data(), static_cast<int64_t>(mine.size()), DType::kInt64,
                                     comm::kTrainerValuesTag)
                           ->Wait(timeout_s));
  std::vector<RankMemory> memory(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    memory[r].rank = r;
    for (int c = 0; c < kMemoryCategoryCount; ++c) memory[r].peak[c] = all[r * kMemoryCategoryCount + c];
  }
  return memory;
}

// Loads the newest checkpoint of `dir` and returns zero-train's position (the step to start
// at), kept inside the checkpoint as user data so that the two never disagree after a crash.
// An absent or empty `dir` (or one holding only an interrupted first save) starts at 0 (the
// first run of a job that always passes --resume);
// a `dir` holding no loadable checkpoint is an error, never a silent restart.
StatusOr<int> Resume(Engine& engine, const std::string& dir, bool reports) {
  // Absent, empty, or holding only what an interrupted first save left: its *.partial
  // directory and the series' lock file (.zerort-lock, Engine::SaveCheckpoint's).
  std::error_code error;
  bool fresh = true;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    fresh = fresh && (absl::EndsWith(name, ".partial") || name == ".zerort-lock");
  }
  if (error && error != std::errc::no_such_file_or_directory) {  // unreadable: never a silent restart
    return absl::FailedPreconditionError(
        absl::StrCat("cannot resume from ", dir, ": cannot list it (", error.message(), ")"));
  }
  if (fresh) {
    if (reports) std::fprintf(stderr, "zero-train: no checkpoint in %s yet: starting at step 0\n", dir.c_str());
    return 0;
  }
  const Status loaded = engine.LoadCheckpoint(dir);
  if (!loaded.ok()) {
    return Status(loaded.code(), absl::StrCat("cannot resume from ", dir, ": ", loaded.message()));
  }
  std::string position = engine.checkpoint_user_data();
  int first = 0;
  if (!absl::SimpleAtoi(position, &first) || first < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot resume from ", dir, ": its trainer position is \"", position,
        "\", not a step number (the checkpoint was not written by zero-train, or is damaged)"));
  }
  if (reports) std::fprintf(stderr, "zero-train: resumed from %s at step %d\n", dir.c_str(), first);
  return first;
}

// After a resume from a checkpoint: the --lr and --weight_decay given on the command line replace
// the values it restored, as given flags win everywhere else; in each group whose config entry
// does not set its own (as in a fresh run, where they are the optimizer's values groups inherit).
// Under a schedule --lr is its peak, which the config holds already: the restored position's lr
// stands (replacing it would run the next step at the peak).
Status ApplyGivenHyper(Engine& engine, const Config& config, const GivenFlags& given, bool reports) {
  const bool lr = given.count("lr") > 0 && config.scheduler.type == LrScheduleType::kNone;
  const bool weight_decay = given.count("weight_decay") > 0;
  if (!lr && !weight_decay) return absl::OkStatus();
  const std::vector<ParamGroupOverrides>& groups = config.optimizer.param_groups;
  for (int group = 0; group < engine.num_groups(); ++group) {
    const ParamGroupOverrides own = group < static_cast<int>(groups.size()) ? groups[group] : ParamGroupOverrides{};
    ZERO_ASSIGN_OR_RETURN(OptimizerHyper hyper, engine.GroupHyper(group));
    if (reports && group == 0) {
      std::fprintf(stderr, "zero-train: the flags replace the checkpoint's%s%s\n",
                   lr ? absl::StrFormat(" lr %g", hyper.lr).c_str() : "",
                   weight_decay ? absl::StrFormat(" weight_decay %g", hyper.weight_decay).c_str() : "");
    }
    if (lr && !own.lr) hyper.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
    if (weight_decay && !own.weight_decay) hyper.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
    ZERO_RETURN_IF_ERROR(engine.SetGroupHyper(group, hyper));
  }
  return absl::OkStatus();
}

Status RunRank(comm::Communicator& comm, const Config& config, const MlpOptions& options, Report* report,
               const std::string& setup, const GivenFlags& given) {
  ZERO_RETURN_IF_ERROR(AgreeOnTrainerFlags(
      comm,
      {{"seed", static_cast<int64_t>(options.seed)}, {"batch", options.batch}, {"steps", absl::GetFlag(FLAGS_steps)},
       {"save_every", absl::GetFlag(FLAGS_save_every)}, {"keep_last", absl::GetFlag(FLAGS_keep_last)},
       {"resume", absl::GetFlag(FLAGS_resume)}, {"tied", options.tied}, {"branch", options.branch},
       {"recompute", options.recompute}, {"checkpoint_dir", TextFingerprint(absl::GetFlag(FLAGS_checkpoint_dir))}},
      config.guard.timeout_s));
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
  Mlp model(options);
  ZERO_RETURN_IF_ERROR(model.Setup(*engine));
  const int steps = absl::GetFlag(FLAGS_steps);
  const std::string checkpoints = absl::GetFlag(FLAGS_checkpoint_dir);
  const int save_every = absl::GetFlag(FLAGS_save_every);
  int first = 0;
  if (absl::GetFlag(FLAGS_resume)) {
    ZERO_ASSIGN_OR_RETURN(first, Resume(*engine, checkpoints, report != nullptr));
    if (first > 0) ZERO_RETURN_IF_ERROR(ApplyGivenHyper(*engine, config, given, report != nullptr));
    if (first >= steps && report != nullptr) {
      std::fprintf(stderr, "zero-train: the checkpoint is at step %d and --steps is %d: nothing left to train (a "
                   "larger --steps trains on)\n", first, steps);
    }
  }
  float loss_scale = engine->loss_scale();
  double loss = 0;
  int reached = first;  // the steps done, from the first of the run (a resumed one's too)
  bool preempted = false;
  for (int step = first; step < steps; ++step) {
    ZERO_ASSIGN_OR_RETURN(double local_loss, model.TrainStep(*engine, step, loss_scale));
    ZERO_ASSIGN_OR_RETURN(const OptimizerHyper hyper, engine->GroupHyper(0));  // this step's lr
    ZERO_ASSIGN_OR_RETURN(StepInfo info, engine->Step());
    loss_scale = info.loss_scale;
    float summed = static_cast<float>(local_loss);
    ZERO_RETURN_IF_ERROR(
        comm.AllReduce(&summed, &summed, 1, DType::kFP32, comm::ReduceOp::kSum, comm::kTrainerValuesTag)
            ->Wait(config.guard.timeout_s));
    loss = summed / comm.size();
    reached = step + 1;
    if (report != nullptr) {
      RankMemory mine;
      const MemoryStats stats = engine->GetMemoryStats();
      std::copy(stats.peak.begin(), stats.peak.end(), mine.peak);
      report->Step(step, loss, info, hyper.lr, mine);
    }
    if (checkpoints.empty()) continue;
    // Every save_every steps, after the last (the only save when save_every is 0), and when a
    // scheduler's signal asks to stop (every rank gets the same answer at the same step).
    ZERO_ASSIGN_OR_RETURN(preempted, engine->PreemptionRequested());
    if ((save_every > 0 && (step + 1) % save_every == 0) || step + 1 == steps || preempted) {
      engine->set_checkpoint_user_data(std::to_string(step + 1));
      ZERO_RETURN_IF_ERROR(engine->SaveCheckpoint(checkpoints, absl::StrCat("step-", step + 1)));
    }
    preempted = preempted && step + 1 < steps;  // on the last step: the run is done, not stopped
    if (preempted) {
      if (report != nullptr) {
        std::fprintf(stderr, "zero-train: stop requested (SIGTERM/SIGUSR1): saved %s/step-%d; continue with --resume\n",
                     checkpoints.c_str(), step + 1);
      }
      break;
    }
  }
  ZERO_ASSIGN_OR_RETURN(double checksum, model.Checksum(*engine));
  ZERO_ASSIGN_OR_RETURN(std::vector<RankMemory> memory, GatherMemory(comm, *engine, config.guard.timeout_s));
  if (report != nullptr) report->Finish(first, reached, preempted, loss, checksum, memory, setup);
  return absl::OkStatus();
}

int Main(const GivenFlags& given) {
  auto config = BuildConfig(given);
  const Status flags = config.ok() ? CheckToolFlags(config->gradient_accumulation_steps) : config.status();
  if (!flags.ok()) {
    std::fprintf(stderr, "zero-train: %s\n", std::string(flags.message()).c_str());
    return 2;
  }
  MlpOptions options;
  options.depth = absl::GetFlag(FLAGS_depth);
  options.width = absl::GetFlag(FLAGS_width);
  options.batch = absl::GetFlag(FLAGS_batch);
  options.micro_batches = config->gradient_accumulation_steps;
  const int64_t micro_batch = config->batch.micro_batch_size_per_rank;
  if (micro_batch > 0) {  // the config's batch section (DeepSpeed's train_micro_batch_size_per_gpu)
    const int64_t per_step = micro_batch * options.micro_batches;
    if (given.count("batch") > 0 && per_step != options.batch) {
      std::fprintf(stderr, "zero-train: --batch %d disagrees with the config's micro-batch of %lld samples × %d "
                   "micro-batches = %lld per rank per step; drop one of them\n", options.batch,
                   static_cast<long long>(micro_batch), options.micro_batches, static_cast<long long>(per_step));
      return 2;
    }
    if (per_step > 1'000'000) {
      std::fprintf(stderr, "zero-train: the config's micro-batch gives %lld samples per rank per step; at most "
                   "1000000\n", static_cast<long long>(per_step));
      return 2;
    }
    options.batch = static_cast<int>(per_step);
  }
  options.tied = absl::GetFlag(FLAGS_tied);
  options.branch = absl::GetFlag(FLAGS_branch);
  options.recompute = absl::GetFlag(FLAGS_recompute);
  options.dtype = config->precision.param;
  options.seed = absl::GetFlag(FLAGS_seed);
  const int steps = absl::GetFlag(FLAGS_steps);
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
  // A scheduler's SIGTERM/SIGUSR1 is a request to save and stop from the start (its default
  // action would end the rank while MPI starts); installed again once MPI has started, in case
  // its start replaced the handlers.
  auto install_preemption_handler = [] {
    if (absl::GetFlag(FLAGS_checkpoint_dir).empty()) return true;
    const Status handler = InstallPreemptionHandler();
    if (!handler.ok()) std::fprintf(stderr, "zero-train: %s\n", std::string(handler.message()).c_str());
    return handler.ok();
  };
  if (!install_preemption_handler()) return 1;
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  if (under_mpirun) {
    auto mpi = comm::CreateMpiCommunicator(nullptr);
    if (!mpi.ok()) {
      std::fprintf(stderr, "zero-train: %s\n", std::string(mpi.status().message()).c_str());
      return 1;
    }
    comms.push_back(std::move(*mpi));
  } else {
    auto group = comm::CreateLocalGroup(absl::GetFlag(FLAGS_ranks));
    if (!group.ok()) {
      std::fprintf(stderr, "zero-train: %s\n", std::string(group.status().message()).c_str());
      return 2;
    }
    comms = std::move(*group);
  }
  if (!install_preemption_handler()) return 1;
  const int world = comms.front()->size();
  const bool save_at_end_only = !absl::GetFlag(FLAGS_checkpoint_dir).empty() && absl::GetFlag(FLAGS_save_every) == 0;
  if (comms.front()->rank() == 0 && save_at_end_only) {
    std::fprintf(stderr, "zero-train: --checkpoint_dir without --save_every: saving one checkpoint after the last step\n");
  }
  const std::string setup = absl::StrCat("zero-train: stage ", config->stage, ", ", world, " rank(s) (",
                                         comms.front()->backend(), "), ", OptimizerTypeName(config->optimizer.type), ", ",
                                         DTypeName(config->precision.param), ", MLP ", options.depth, "×", options.width,
                                         ", batch ", options.batch, "/rank");
  Report report(steps, absl::GetFlag(FLAGS_json));
  std::vector<Status> results(comms.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < comms.size(); ++i) {
    threads.emplace_back([&, i] {
      comm::Communicator& comm = *comms[i];
      results[i] = RunRank(comm, *config, options, comm.rank() == 0 ? &report : nullptr, setup, given);
    });
  }
  for (auto& t : threads) t.join();
  int exit_code = 0;
  for (size_t i = 0; i < comms.size(); ++i) {
    if (results[i].ok()) continue;
    std::fprintf(stderr, "zero-train: rank %d: %s\n", comms[i]->rank(), results[i].ToString().c_str());
    exit_code = 1;
  }
  if (exit_code != 0 && under_mpirun) (void)comms.front()->AbortJob(exit_code);  // end the batch job
  return exit_code;
}

}  // namespace
}  // namespace zero::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "trains an MLP on a synthetic teacher-student task with ZeroRT.\n\n"
      "  zero-train [--ranks N] [--stage 0|1|2|3] [--optimizer adamw] [--lr 2e-3] [--steps 100] ...\n"
      "  zero-train --config zero.json --lr 3e-3     # flags given on the command line win\n"
      "  mpirun -np 4 zero-train --json              # one rank per process");
  zero::tools::HelpShowsOwnFlags("zero-train/");
  std::vector<char*> args = zero::tools::HelpAliases(argc, argv);
  const zero::tools::GivenFlags given = zero::tools::FindGivenFlags(static_cast<int>(args.size()), args.data());
  const std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (!zero::tools::NoExtraArguments(positional, 1, "zero-train")) return 2;
  return zero::tools::Main(given);
}
