// zero-train: ZeroRT's main job and the reference example of embedding it. Trains an MLP on a
// synthetic teacher-student task, data-parallel over in-process ranks (default) or, launched by
// mpirun, one rank per process on the MPI communicator. Rank 0 reports: a live progress line
// on a terminal, plain lines otherwise, one JSON object per step with --json and a summary.
//
//   zero-train                                   # 4 in-process ranks, stage 2, AdamW
//   zero-train --stage 3 --ranks 8 --precision bf16 --steps 500
//   mpirun -np 4 zero-train --json > run.jsonl
//   zero-train --config zero.json --lr 3e-3      # flags given on the command line win
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "mlp.h"
#include "report.h"
#include "zero/communicator.h"
#include "zero/engine.h"

ABSL_FLAG(int, ranks, 4, "in-process ranks (under mpirun every process is one rank instead)");
ABSL_FLAG(int, stage, 2, "ZeRO stage: 0 (data parallel), 1, 2 or 3");
ABSL_FLAG(std::string, optimizer, "adamw", "adamw, adam, sgd, lion or lamb");
ABSL_FLAG(double, lr, 2e-3, "learning rate");
ABSL_FLAG(double, weight_decay, 0.01, "weight decay");
ABSL_FLAG(std::string, precision, "fp32",
          "params and gradients: fp32, bf16 or fp16 (16-bit keep fp32 master weights; fp16 adds dynamic loss scaling)");
ABSL_FLAG(int, steps, 100, "optimizer steps");
ABSL_FLAG(int64_t, reduce_bucket_elems, 25'000'000, "elements per gradient bucket");
ABSL_FLAG(int64_t, first_bucket_elems, 1'000'000, "elements in the first bucket");
ABSL_FLAG(int, accumulation, 1, "micro-batches per optimizer step (gradient_accumulation_steps)");
ABSL_FLAG(double, clip, 0.0, "clip the global gradient norm to this (0: off)");
ABSL_FLAG(uint64_t, seed, 1, "seed of data, teacher and initial weights");
ABSL_FLAG(std::string, config, "", "a JSON config (DESIGN.md keys); flags given on the command line override it");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(bool, json, false, "one JSON object per step on stdout, then a summary object");
ABSL_FLAG(std::string, checkpoint_dir, "", "where to save checkpoints (each rank its shard; loads at any rank count)");
ABSL_FLAG(int, save_every, 0, "save a checkpoint every N steps (and after the last) into --checkpoint_dir");
ABSL_FLAG(bool, resume, false, "continue from --checkpoint_dir if it holds a checkpoint");
ABSL_FLAG(int, depth, 4, "hidden layers");
ABSL_FLAG(int, width, 64, "layer width");
ABSL_FLAG(int, batch, 16, "samples per rank per step");
ABSL_FLAG(bool, tied, false, "tie the output projection to layer0.weight (its gradient arrives twice)");
ABSL_FLAG(bool, branch, false, "a branch used on even steps only (no rank uses it on odd steps)");
ABSL_FLAG(bool, recompute, false, "re-fire the middle layer's gradient as reentrant checkpointing does");

namespace zero::tools {
namespace {

// Names of the flags on the command line ("--lr=3e-3", "--lr 3e-3", "--nojson" → "json"), so
// that they override a --config file while the others keep the file's values. (Debian's
// abseil keeps CommandLineFlag::IsSpecifiedOnCommandLine private.)
std::set<std::string> GivenFlags(int argc, char** argv) {
  std::set<std::string> given;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.rfind("-", 0) != 0) continue;
    arg = arg.substr(arg.find_first_not_of('-'));
    arg = arg.substr(0, arg.find('='));
    if (absl::FindCommandLineFlag(arg) == nullptr && arg.rfind("no", 0) == 0) arg = arg.substr(2);
    given.insert(arg);
  }
  return given;
}

StatusOr<Config> BuildConfig(const std::set<std::string>& given) {
  Config config;
  const std::string path = absl::GetFlag(FLAGS_config);
  const bool file = !path.empty();
  if (file) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read --config ", path));
    std::stringstream text;
    text << in.rdbuf();
    ZERO_ASSIGN_OR_RETURN(config, Config::FromJson(text.str()));
  } else {
    config.guard.timeout_s = 120;  // a rank that fails alone must not keep the others for 10 min
  }
  auto use = [file, &given](const char* flag) { return !file || given.count(flag) > 0; };
  if (use("stage")) config.stage = absl::GetFlag(FLAGS_stage);
  if (use("device")) {
    ZERO_ASSIGN_OR_RETURN(config.device, ParseDevice(absl::GetFlag(FLAGS_device)));
  }
  if (use("optimizer")) {
    ZERO_ASSIGN_OR_RETURN(Config parsed, Config::FromJson(absl::StrCat(
                                             "{\"optimizer\": {\"type\": \"", absl::GetFlag(FLAGS_optimizer), "\"}}")));
    config.optimizer.type = parsed.optimizer.type;
  }
  if (use("lr")) config.optimizer.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  if (use("weight_decay")) config.optimizer.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  if (use("precision")) {
    ZERO_ASSIGN_OR_RETURN(DType dtype, ParseDType(absl::GetFlag(FLAGS_precision)));
    config.precision.param = config.precision.grad = config.precision.reduce = dtype;
    if (dtype == DType::kFP16) config.loss_scale.mode = LossScaleMode::kDynamic;
  }
  if (use("reduce_bucket_elems")) config.buckets.reduce_bucket_elems = absl::GetFlag(FLAGS_reduce_bucket_elems);
  if (use("first_bucket_elems")) config.buckets.first_bucket_elems = absl::GetFlag(FLAGS_first_bucket_elems);
  if (use("accumulation")) config.gradient_accumulation_steps = absl::GetFlag(FLAGS_accumulation);
  if (use("clip")) config.clip_grad_norm = static_cast<float>(absl::GetFlag(FLAGS_clip));
  // The model's optional patterns need the guard policies that handle them.
  if (absl::GetFlag(FLAGS_tied) || absl::GetFlag(FLAGS_recompute)) config.guard.on_duplicate = DuplicatePolicy::kCount;
  if (absl::GetFlag(FLAGS_branch)) config.guard.on_unused = UnusedPolicy::kZero;
  ZERO_RETURN_IF_ERROR(config.Validate());
  return config;
}

// Collects every rank's peak bytes on rank 0 (raw 64-bit values travel as 16-bit elements).
StatusOr<std::vector<RankMemory>> GatherMemory(comm::Communicator& comm, const Engine& engine, double timeout_s) {
  const MemoryStats stats = engine.GetMemoryStats();
  std::vector<int64_t> mine(stats.peak.begin(), stats.peak.end()), all(mine.size() * comm.size());
  ZERO_RETURN_IF_ERROR(comm.AllGather(mine.data(), all.data(), static_cast<int64_t>(mine.size() * 4), DType::kFP16)
                           ->Wait(timeout_s));
  std::vector<RankMemory> memory(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    memory[r].rank = r;
    for (int c = 0; c < kMemoryCategoryCount; ++c) memory[r].peak[c] = all[r * kMemoryCategoryCount + c];
  }
  return memory;
}

Status RunRank(comm::Communicator& comm, const Config& config, const MlpOptions& options, Report* report,
               const std::string& setup) {
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
  Mlp model(options);
  ZERO_RETURN_IF_ERROR(model.Setup(*engine));
  const int steps = absl::GetFlag(FLAGS_steps);
  const std::string checkpoints = absl::GetFlag(FLAGS_checkpoint_dir);
  const int save_every = absl::GetFlag(FLAGS_save_every);
  int first = 0;
  // The trainer keeps its own position (steps skipped for overflow count here, not in the
  // engine's step count) beside the engine's checkpoint, as a data loader would.
  const std::string position = checkpoints + "/zero-train.step";
  if (absl::GetFlag(FLAGS_resume) && std::ifstream(checkpoints + "/meta.json").good()) {
    ZERO_RETURN_IF_ERROR(engine->LoadCheckpoint(checkpoints));
    std::ifstream(position) >> first;
    if (report != nullptr) std::fprintf(stderr, "zero-train: resumed from %s at step %d\n", checkpoints.c_str(), first);
  }
  float loss_scale = engine->loss_scale();
  double loss = 0;
  for (int step = first; step < steps; ++step) {
    ZERO_ASSIGN_OR_RETURN(double local_loss, model.TrainStep(*engine, step, loss_scale));
    ZERO_ASSIGN_OR_RETURN(StepInfo info, engine->Step());
    loss_scale = info.loss_scale;
    float summed = static_cast<float>(local_loss);
    ZERO_RETURN_IF_ERROR(comm.AllReduce(&summed, &summed, 1, DType::kFP32, comm::ReduceOp::kSum)->Wait(config.guard.timeout_s));
    loss = summed / comm.size();
    if (!checkpoints.empty() && save_every > 0 && ((step + 1) % save_every == 0 || step + 1 == steps)) {
      ZERO_RETURN_IF_ERROR(engine->SaveCheckpoint(checkpoints));
      if (comm.rank() == 0) std::ofstream(position) << step + 1 << "\n";
    }
    if (report != nullptr) {
      RankMemory mine;
      const MemoryStats stats = engine->GetMemoryStats();
      std::copy(stats.peak.begin(), stats.peak.end(), mine.peak);
      report->Step(step, loss, info, mine);
    }
  }
  ZERO_ASSIGN_OR_RETURN(double checksum, model.Checksum(*engine));
  ZERO_ASSIGN_OR_RETURN(std::vector<RankMemory> memory, GatherMemory(comm, *engine, config.guard.timeout_s));
  if (report != nullptr) report->Finish(loss, checksum, memory, setup);
  return absl::OkStatus();
}

int Main(const std::set<std::string>& given) {
  auto config = BuildConfig(given);
  if (!config.ok()) {
    std::fprintf(stderr, "zero-train: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  MlpOptions options;
  options.depth = absl::GetFlag(FLAGS_depth);
  options.width = absl::GetFlag(FLAGS_width);
  options.batch = absl::GetFlag(FLAGS_batch);
  options.micro_batches = config->gradient_accumulation_steps;
  options.tied = absl::GetFlag(FLAGS_tied);
  options.branch = absl::GetFlag(FLAGS_branch);
  options.recompute = absl::GetFlag(FLAGS_recompute);
  options.dtype = config->precision.param;
  options.seed = absl::GetFlag(FLAGS_seed);
  if (options.depth < 1 || options.width < 1 || options.batch < options.micro_batches) {
    std::fprintf(stderr, "zero-train: need --depth ≥ 1, --width ≥ 1 and --batch ≥ --accumulation\n");
    return 2;
  }
  const int steps = absl::GetFlag(FLAGS_steps);
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
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
  const int world = comms.front()->size();
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
      results[i] = RunRank(comm, *config, options, comm.rank() == 0 ? &report : nullptr, setup);
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
  absl::SetProgramUsageMessage("trains an MLP with ZeroRT; see --helpfull");
  const std::set<std::string> given = zero::tools::GivenFlags(argc, argv);
  absl::ParseCommandLine(argc, argv);
  return zero::tools::Main(given);
}
