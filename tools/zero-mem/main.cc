// zero-mem: how much memory each rank needs for model states at ZeRO stages 0-3.
//
//   zero-mem estimate --params 7.5e9 --ranks 64          # the ZeRO paper's Table 1 row
//   zero-mem estimate --preset llama-7b --ranks 1,8,64,512 --plot memory.png
//   zero-mem measure --layers 8 --width 1024 --ranks 1,2,4 --csv
//   zero-mem estimate --params 7.5e9 --grad_dtype fp32   # fp32 gradient accumulation
//   zero-mem measure --layers 8 --width 2048 --lora_rank 8  # a LoRA job: frozen base, adapters
//
// `estimate` evaluates DESIGN.md's per-rank formulas and prints DeepSpeed's estimator beside
// them; `measure` runs the engine on in-process ranks and reports the accounting allocator's
// peak bytes per category next to the formula, so the extra (bucket buffers, gathered units)
// is visible. `--plot FILE.png|FILE.svg` draws per-rank memory against rank count with gnuplot.
#include <sys/wait.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/command_line.h"
#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "estimate.h"
#include "measure.h"

ABSL_FLAG(double, params, 0, "estimate: parameter count Ψ (e.g. 7.5e9)");
ABSL_FLAG(std::string, preset, "", "estimate: zero-paper (7.5B), gpt2-xl (1.56B), llama-7b (6.74B), llama-70b (69B)");
ABSL_FLAG(double, largest_layer, 0, "estimate: parameters of the largest layer (DeepSpeed's ZeRO-3 figure); default 1% of Ψ");
ABSL_FLAG(std::string, ranks, "", "rank counts, comma-separated (estimate default 64; measure default 1,2,4)");
ABSL_FLAG(std::string, precision, "mixed", "mixed (16-bit params + fp32 master; gradients: --grad_dtype) or fp32");
ABSL_FLAG(std::string, optimizer, "adamw", "adamw, adam, lamb, sgd (momentum) or lion");
ABSL_FLAG(std::string, grad_dtype, "",
          "gradient dtype (precision.grad): bf16 (--precision mixed; the default there, the ZeRO paper's "
          "2 bytes) or fp32 (4 bytes: gradients accumulated and reduced in fp32)");
ABSL_FLAG(double, frozen_fraction, 0,
          "estimate: the fraction of Ψ that is frozen (a LoRA job's base: no gradient, no optimizer state; "
          "sharded at stage 3), in [0, 1)");
ABSL_FLAG(int, lora_rank, 0,
          "measure: > 0 freezes each layer's width² weight (sharded at stage 3) and trains a rank-R adapter beside it");
ABSL_FLAG(int, layers, 8, "measure: square layers in the model (1 to 10000; layers × width² ≤ 1e9)");
ABSL_FLAG(int, width, 512, "measure: layer width (≥ 1)");
ABSL_FLAG(int, steps, 2, "measure: optimizer steps before reading the peaks (≥ 1)");
ABSL_FLAG(bool, csv, false, "print CSV instead of a table");
ABSL_FLAG(std::string, plot, "", "draw per-rank memory against rank count into FILE.png or FILE.svg (gnuplot)");

namespace zero::tools {
namespace {

constexpr int kMaxRanks = 1 << 20;           // estimate: a formula, any plausible rank count
constexpr int kMaxMeasuredRanks = 1024;      // measure: in-process ranks are threads
constexpr double kMaxMeasuredParams = 1e9;   // layers × width², on every in-process rank
constexpr int kMaxMeasuredLayers = 10000;    // a measurement of seconds, not hours

std::string Gb(double bytes) {
  const double gb = bytes / 1e9;
  if (gb >= 10) return absl::StrFormat("%.1f GB", gb);
  if (gb >= 1) return absl::StrFormat("%.2f GB", gb);
  if (bytes >= 1e6) return absl::StrFormat("%.1f MB", bytes / 1e6);
  return absl::StrFormat("%.1f kB", bytes / 1e3);  // a small model's, not "0.0 MB"
}

StatusOr<std::vector<int>> RankList(const std::string& fallback, int most) {
  const std::string text = absl::GetFlag(FLAGS_ranks).empty() ? fallback : absl::GetFlag(FLAGS_ranks);
  std::vector<int> ranks;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || n > most) {
      return absl::InvalidArgumentError(absl::StrCat("--ranks ", text, ": expected whole numbers from 1 to ", most));
    }
    ranks.push_back(n);
  }
  return ranks;
}

// `text` inside single quotes for the shell, and for gnuplot (which doubles a quote).
std::string ShellQuoted(const std::string& text) { return "'" + absl::StrReplaceAll(text, {{"'", "'\\''"}}) + "'"; }
std::string GnuplotQuoted(const std::string& text) { return "'" + absl::StrReplaceAll(text, {{"'", "''"}}) + "'"; }

// Runs gnuplot on `script`: its own message when it fails, or that it is not installed.
Status RunGnuplot(const std::string& script, const std::string& path) {
  const std::string command = absl::StrCat("gnuplot ", ShellQuoted(script), " 2>&1");
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::UnavailableError(absl::StrCat("cannot run gnuplot: ", std::strerror(errno)));
  std::string said;
  char chunk[512];
  for (size_t got; (got = std::fread(chunk, 1, sizeof chunk, pipe)) > 0;) said.append(chunk, got);
  const int rc = ::pclose(pipe);
  if (rc == 0) return absl::OkStatus();
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 127) {
    return absl::UnavailableError("gnuplot is not installed (scripts/setup.sh installs gnuplot-nox); --plot needs it");
  }
  return absl::UnavailableError(absl::StrCat("gnuplot could not draw ", path, ": ", absl::StripAsciiWhitespace(said)));
}

// --plot names a file gnuplot draws: .png or .svg (any other name would get PNG data).
Status CheckPlotPath() {
  const std::string path = absl::GetFlag(FLAGS_plot);
  if (path.empty() || absl::EndsWith(path, ".png") || absl::EndsWith(path, ".svg")) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--plot ", path, ": name a .png or .svg file"));
}

// Rows of (ranks, per-stage bytes) drawn as one line per stage; `measured` adds points.
Status Plot(const std::string& path, const std::vector<int>& ranks, const std::vector<std::vector<double>>& bytes,
            const std::vector<std::vector<double>>& measured, const std::string& title) {
  const std::string data = path + ".dat", script = path + ".gp";
  std::ofstream out(data);
  if (!out.is_open()) {
    return absl::UnavailableError(absl::StrCat("--plot ", path, ": cannot create ", data, ": ", std::strerror(errno)));
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    out << ranks[i];
    for (double b : bytes[i]) out << " " << b / 1e9;
    for (size_t s = 0; s < 4; ++s) out << " " << (measured.empty() || measured[i][s] < 0 ? NAN : measured[i][s] / 1e9);
    out << "\n";
  }
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("--plot ", path, ": cannot write ", data));
  const bool svg = path.size() > 4 && path.substr(path.size() - 4) == ".svg";
  std::ofstream gp(script);
  gp << "set terminal " << (svg ? "svg size 900,560" : "pngcairo size 900,560") << "\n"
     << "set output " << GnuplotQuoted(path) << "\nset title " << GnuplotQuoted(title) << "\n"
     << "set xlabel 'data-parallel ranks'\nset ylabel 'GB per rank (model states)'\n"
     << "set logscale x 2\nset logscale y\nset grid\nset key outside right\n"
     << "plot for [s=0:3] " << GnuplotQuoted(data)
     << " using 1:(column(s+2)) with linespoints lw 2 lc (s+1) title sprintf('stage %d (formula)', s)";
  if (!measured.empty()) {
    gp << ", for [s=0:3] " << GnuplotQuoted(data)
       << " using 1:(column(s+6)) with points pt 7 ps 1.5 lc (s+1) title sprintf('stage %d (measured)', s)";
  }
  gp << "\n";
  gp.close();
  Status drawn = gp ? RunGnuplot(script, path)
                    : absl::UnavailableError(absl::StrCat("--plot ", path, ": cannot write ", script));
  std::remove(data.c_str());
  std::remove(script.c_str());
  ZERO_RETURN_IF_ERROR(drawn);
  std::fprintf(stderr, "zero-mem: wrote %s\n", path.c_str());
  return absl::OkStatus();
}

Status Estimate() {
  ZERO_RETURN_IF_ERROR(CheckPlotPath());
  const std::map<std::string, double> presets = {
      {"zero-paper", 7.5e9}, {"gpt2-xl", 1.558e9}, {"llama-7b", 6.738e9}, {"llama-70b", 68.98e9}};
  double params = absl::GetFlag(FLAGS_params);
  if (!absl::GetFlag(FLAGS_preset).empty() && params != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--preset ", absl::GetFlag(FLAGS_preset), " and --params ", params,
                                                   " both give Ψ: give one"));
  }
  if (!absl::GetFlag(FLAGS_preset).empty()) {
    auto it = presets.find(absl::GetFlag(FLAGS_preset));
    if (it == presets.end()) return absl::InvalidArgumentError(absl::StrCat("unknown --preset ", absl::GetFlag(FLAGS_preset)));
    params = it->second;
  }
  if (params == 0) return absl::InvalidArgumentError("give --params Ψ (e.g. 7.5e9) or --preset");
  if (!(params >= 1 && params <= 1e15)) {
    return absl::InvalidArgumentError(absl::StrCat("--params ", params, ": allowed: ≥ 1 and ≤ 1e15"));
  }
  const double frozen_fraction = absl::GetFlag(FLAGS_frozen_fraction);
  if (!(frozen_fraction >= 0 && frozen_fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("--frozen_fraction ", frozen_fraction, ": allowed: 0 to below 1"));
  }
  const double frozen = frozen_fraction * params, trainable = params - frozen;
  const double largest_layer = absl::GetFlag(FLAGS_largest_layer);
  if (!(largest_layer >= 0 && largest_layer <= params)) {
    return absl::InvalidArgumentError(absl::StrCat("--largest_layer ", largest_layer, ": allowed: 0 (1% of Ψ) to Ψ"));
  }
  ZERO_ASSIGN_OR_RETURN(StateBytes b, BytesPerParam(absl::GetFlag(FLAGS_precision), absl::GetFlag(FLAGS_optimizer),
                                                       absl::GetFlag(FLAGS_grad_dtype)));
  ZERO_ASSIGN_OR_RETURN(std::vector<int> ranks, RankList("64", kMaxRanks));
  const double largest = largest_layer > 0 ? largest_layer : 0.01 * params;
  const bool deepspeed = absl::GetFlag(FLAGS_precision) == "mixed" && absl::GetFlag(FLAGS_optimizer).rfind("adam", 0) == 0;
  std::vector<std::vector<double>> rows;
  if (absl::GetFlag(FLAGS_csv)) {
    std::printf("ranks,stage0_bytes,stage1_bytes,stage2_bytes,stage3_bytes%s\n",
                deepspeed ? ",deepspeed_zero2_bytes,deepspeed_zero3_bytes" : "");
  } else {
    std::printf("zero-mem estimate: Ψ = %.4g params%s, %s precision, %s: bytes/param params %g, grads %g, optimizer K = %g\n",
                params, frozen > 0 ? absl::StrFormat(" (%.4g frozen)", frozen).c_str() : "",
                absl::GetFlag(FLAGS_precision).c_str(), absl::GetFlag(FLAGS_optimizer).c_str(), b.param, b.grad,
                b.optimizer);
    std::printf("%8s %12s %12s %12s %12s", "ranks", "stage 0", "stage 1", "stage 2", "stage 3");
    if (deepspeed) std::printf("   %18s %18s", "DeepSpeed ZeRO-2", "DeepSpeed ZeRO-3");
    std::printf("\n");
  }
  for (int n : ranks) {
    std::vector<double> row;
    for (int stage = 0; stage < 4; ++stage) {
      row.push_back(StageBytes(stage, trainable, n, b) + FrozenBytes(stage, frozen, n, b));
    }
    rows.push_back(row);
    if (absl::GetFlag(FLAGS_csv)) {
      std::printf("%d,%.0f,%.0f,%.0f,%.0f", n, row[0], row[1], row[2], row[3]);
      if (deepspeed) std::printf(",%.0f,%.0f", DeepSpeedZero2Bytes(params, n), DeepSpeedZero3Bytes(params, largest, n));
      std::printf("\n");
      continue;
    }
    std::printf("%8d %12s %12s %12s %12s", n, Gb(row[0]).c_str(), Gb(row[1]).c_str(), Gb(row[2]).c_str(), Gb(row[3]).c_str());
    if (deepspeed) {
      std::printf("   %18s %18s", Gb(DeepSpeedZero2Bytes(params, n)).c_str(), Gb(DeepSpeedZero3Bytes(params, largest, n)).c_str());
    }
    std::printf("\n");
  }
  if (deepspeed && !absl::GetFlag(FLAGS_csv)) {
    std::printf("DeepSpeed's estimators (no offload): ZeRO-2 4 bytes/param whole (fp16 params and gradients) + 16 "
                "sharded; ZeRO-3 18 bytes/param sharded + 4 × the largest layer (%.3g params%s).\n",
                largest, absl::GetFlag(FLAGS_largest_layer) > 0 ? "" : ", assumed 1% of Ψ");
    if (frozen > 0) {
      std::printf("They count every param as trained; here frozen params hold only their %g-byte copy.\n", b.param);
    }
  }
  if (!absl::GetFlag(FLAGS_plot).empty()) {
    ZERO_RETURN_IF_ERROR(Plot(absl::GetFlag(FLAGS_plot), ranks, rows, {}, absl::StrFormat("model states per rank, %.3g params", params)));
  }
  return absl::OkStatus();
}

// measure's model flags.
Status CheckModelFlags(const MeasureOptions& o) {
  if (o.layers < 1 || o.layers > kMaxMeasuredLayers) {
    return absl::InvalidArgumentError(absl::StrCat("--layers ", o.layers, ": allowed: 1 to ", kMaxMeasuredLayers,
                                                   " (each layer is a param and, at stage 3, a unit)"));
  }
  if (o.width < 1) return absl::InvalidArgumentError(absl::StrCat("--width ", o.width, ": allowed: ≥ 1"));
  if (o.steps < 1) return absl::InvalidArgumentError(absl::StrCat("--steps ", o.steps, ": allowed: ≥ 1"));
  if (o.lora_rank < 0 || o.lora_rank > o.width) {
    return absl::InvalidArgumentError(absl::StrCat("--lora_rank ", o.lora_rank, ": allowed: 0 to --width"));
  }
  if (double(o.layers) * o.width * o.width > kMaxMeasuredParams) {
    return absl::InvalidArgumentError(absl::StrCat("--layers ", o.layers, " --width ", o.width,
                                                   ": the model would have layers × width² > 1e9 params"));
  }
  return absl::OkStatus();
}

Status Measure() {
  ZERO_RETURN_IF_ERROR(CheckPlotPath());
  MeasureOptions o;
  o.layers = absl::GetFlag(FLAGS_layers);
  o.width = absl::GetFlag(FLAGS_width);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.lora_rank = absl::GetFlag(FLAGS_lora_rank);
  ZERO_RETURN_IF_ERROR(CheckModelFlags(o));
  const std::string precision = absl::GetFlag(FLAGS_precision);
  o.dtype = precision == "fp32" ? DType::kFP32 : DType::kBF16;
  ZERO_ASSIGN_OR_RETURN(StateBytes b, BytesPerParam(precision, absl::GetFlag(FLAGS_optimizer),
                                                     absl::GetFlag(FLAGS_grad_dtype)));
  o.grad_dtype = b.grad == 4 ? DType::kFP32 : o.dtype;  // the engine keeps what the formula counts
  const nlohmann::json optimizer = {{"optimizer", {{"type", absl::GetFlag(FLAGS_optimizer)}}}};
  ZERO_ASSIGN_OR_RETURN(Config parsed, Config::FromJson(optimizer.dump()));
  o.optimizer = parsed.optimizer.type;
  ZERO_ASSIGN_OR_RETURN(std::vector<int> ranks, RankList("1,2,4", kMaxMeasuredRanks));
  const auto [trainable, frozen] = ModelParams(o);
  const double params = trainable + frozen;
  const bool csv = absl::GetFlag(FLAGS_csv);
  if (csv) {
    std::printf("stage,ranks,params_bytes,grads_bytes,optimizer_bytes,comm_buffers_bytes,gathered_bytes,workspace_bytes,total_bytes,estimate_bytes\n");
  } else {
    std::printf("zero-mem measure: %d layers × %d²%s = %.4g params%s, %s, %s gradients, %s; peak bytes per rank "
                "(rank 0), after %d steps\n", o.layers, o.width,
                o.lora_rank > 0 ? absl::StrFormat(" frozen + rank-%d adapters", o.lora_rank).c_str() : "", params,
                frozen > 0 ? absl::StrFormat(" (%.1f%% frozen)", 100.0 * frozen / params).c_str() : "",
                precision.c_str(), DTypeName(o.grad_dtype), absl::GetFlag(FLAGS_optimizer).c_str(), o.steps);
    std::printf("%5s %5s %11s %11s %11s %11s %11s %11s | %11s %11s %8s\n", "stage", "ranks", "params", "grads", "optimizer",
                "comm_bufs", "gathered", "workspace", "measured", "formula", "extra");
  }
  std::vector<std::vector<double>> formula(ranks.size()), measured(ranks.size());
  int failed = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    for (int stage = 0; stage < 4; ++stage) {
      const double estimate = StageBytes(stage, trainable, ranks[i], b) + FrozenBytes(stage, frozen, ranks[i], b);
      formula[i].push_back(estimate);
      auto stats = MeasureLocal(o, stage, ranks[i]);
      if (!stats.ok()) {
        measured[i].push_back(-1);
        ++failed;
        // In a CSV the row is absent; the reason goes to stderr.
        std::fprintf(csv ? stderr : stdout, "%5d %5d  not measured: %s\n", stage, ranks[i],
                     std::string(stats.status().message()).c_str());
        continue;
      }
      const double total = static_cast<double>(stats->total_peak);
      measured[i].push_back(total);
      if (csv) {
        std::printf("%d,%d", stage, ranks[i]);
        for (int64_t p : stats->peak) std::printf(",%lld", static_cast<long long>(p));
        std::printf(",%.0f,%.0f\n", total, estimate);
      } else {
        std::printf("%5d %5d", stage, ranks[i]);
        for (int64_t p : stats->peak) std::printf(" %11s", Gb(double(p)).c_str());
        std::printf(" | %11s %11s %+7.1f%%\n", Gb(total).c_str(), Gb(estimate).c_str(), 100.0 * (total - estimate) / estimate);
      }
    }
  }
  if (!csv) {
    std::printf("extra = measured total peak − formula: bucket buffers (stages 2-3), gathered units (stage 3: one\n"
                "unit per layer, prefetching two layers ahead), padding, norm workspace.\n");
  }
  if (!absl::GetFlag(FLAGS_plot).empty()) {
    ZERO_RETURN_IF_ERROR(Plot(absl::GetFlag(FLAGS_plot), ranks, formula, measured,
                              absl::StrFormat("model states per rank, %.3g params: formula and measured", params)));
  }
  if (failed > 0) {
    return absl::AbortedError(absl::StrFormat(
        "%d of %d measurements failed (the rows above say why; out of memory: a smaller model or fewer ranks)",
        failed, 4 * static_cast<int>(ranks.size())));
  }
  return absl::OkStatus();
}

// The flags only one command reads; given to the other, they would be ignored silently.
Status CheckFlagsBelongTo(const std::string& command, int argc, char** argv) {
  const std::vector<const char*> estimate_only = {"params", "preset", "largest_layer", "frozen_fraction"};
  const std::vector<const char*> measure_only = {"layers", "width", "steps", "lora_rank"};
  const bool estimate = command == "estimate";
  for (const char* flag : estimate ? measure_only : estimate_only) {
    if (!FlagGiven(argc, argv, flag)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " is a flag of zero-mem ", estimate ? "measure" : "estimate", ", which ", command,
        " would ignore", estimate ? " (estimate takes the model's size from --params or --preset)"
                                  : " (measure builds a model from --layers, --width and --lora_rank)"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace zero::tools

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "memory per rank for model states at ZeRO stages 0-3.\n\n"
      "  zero-mem estimate --params 7.5e9 --ranks 64       # DESIGN.md's formulas, DeepSpeed's beside\n"
      "  zero-mem estimate --preset llama-7b --ranks 1,8,64 --plot memory.png\n"
      "  zero-mem measure --layers 8 --width 1024 --ranks 1,2,4 [--csv]   # the engine's peaks\n"
      "  zero-mem estimate --params 7e9 --frozen_fraction 0.99 / measure --lora_rank 8   # a LoRA job");
  const std::vector<char*> positional = zero::tools::ParseToolCommandLine(argc, argv, "zero-mem/");
  if (!zero::tools::NoExtraArguments(positional, 2, "zero-mem")) return 2;
  const std::string command = positional.size() > 1 ? positional[1] : "";
  if (command != "estimate" && command != "measure") {
    std::fprintf(stderr, "usage: zero-mem estimate|measure [flags] (see --help)\n");
    return 2;
  }
  zero::Status status = zero::tools::CheckFlagsBelongTo(command, argc, argv);
  if (status.ok()) status = command == "estimate" ? zero::tools::Estimate() : zero::tools::Measure();
  if (!status.ok()) {
    std::fprintf(stderr, "zero-mem: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
