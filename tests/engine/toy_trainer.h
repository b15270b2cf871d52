// A small but real data-parallel trainer for the engine tests, written against the public API
// only: a two-layer tanh MLP (odd sizes) learning a fixed random teacher on synthetic data.
// Each step draws a global batch; rank r computes the gradient of its slice, micro-batch by
// micro-batch, and hands it to the engine in backward order (layer 2 before layer 1).
#ifndef ZERO_TESTS_ENGINE_TOY_TRAINER_H_
#define ZERO_TESTS_ENGINE_TOY_TRAINER_H_

#include <functional>
#include <string>
#include <vector>

#include "zero/engine.h"

namespace zero::testing {

struct ToyOptions {
  int steps = 50;
  int inputs = 13, hidden = 37, outputs = 5;
  int global_batch = 12;       ///< divisible by every world size tested (1-4)
  int micro_batches = 1;       ///< must equal the config's gradient_accumulation_steps
  /// Data-dependent control flow: on odd steps the forward pass does not gather layer 1's
  /// unit (it reuses the values read on the step before), so the gather order changes.
  bool skip_unit0_on_odd_steps = false;
  /// Checkpoints: start at this step's data, after loading `load_dir` if set; save to
  /// `save_dir` once step `save_after` (counted like first_step) is done.
  int first_step = 0;
  std::string load_dir, save_dir;
  int save_after = -1;
  DType dtype = DType::kFP32;  ///< params and gradients
  /// The biases' optimizer group (1: a second group, the usual no-decay one; the config needs
  /// param_groups for it, and stages 0-2: a stage-3 unit, here a layer, has one group).
  int bias_group = 0;
  uint64_t seed = 7;
  /// When set, called where the trainer's own work meets the engine's device work: before it
  /// reads a param or gradient view, and after it hands a gradient over (before that buffer
  /// is reused). A device model runs its queue there, as one stream orders a GPU trainer's
  /// kernels after the engine's.
  std::function<Status()> device_work;
  /// When set, called once the model is registered and its values set (or loaded), before
  /// the first step: a test adds what it needs to the engine (a lender of gathered memory).
  std::function<Status(Engine&)> after_setup;
  /// Hand every gradient over with LendGrad (host memory kept unchanged until Step returns
  /// and the device work queued by then has run, then poisoned with NaN) instead of through
  /// GradBuffer and AccumulateGrad.
  bool lend_grads = false;
};

struct ToyResult {
  std::vector<double> losses;   ///< global-batch loss before each step (same on every rank)
  std::vector<StepInfo> infos;
  std::vector<std::vector<float>> final_params;  ///< decoded to fp32
};

/// The engine config the tests start from: AdamW, small buckets so params straddle shards;
/// at stage 3 every unit is gathered on demand (no persistent units).
Config ToyConfig(int stage);

/// Registers the model's four params (fc1.weight, fc1.bias, fc2.weight, fc2.bias; one
/// stage-3 unit per layer) and finalizes.
StatusOr<std::vector<ParamId>> RegisterToyModel(Engine& engine, const ToyOptions& options);

/// Registers the model, finalizes, trains. Every rank of the engine's group must call it.
Status TrainToy(Engine& engine, const ToyOptions& options, ToyResult* result);

/// One rank's run of TrainOnLocalRanks.
struct RankRun {
  ToyResult result;
  MemoryStats memory;
  EngineCounters counters;
};

/// Trains the toy model on `world` in-process ranks; each rank's run. A rank that fails is a
/// test failure naming it.
std::vector<RankRun> TrainOnLocalRanks(int world, const Config& config, const ToyOptions& options);

/// The same training without ZeroRT: one process, full batch, AdamW (or LAMB when the config
/// says so) in float64.
std::vector<double> ReferenceLosses(const ToyOptions& options, const Config& config);

}  // namespace zero::testing

#endif  // ZERO_TESTS_ENGINE_TOY_TRAINER_H_
