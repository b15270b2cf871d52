// Fresh per-rank gradients and initial values, and a float64 AdamW to check the engine's
// steps against (as torch.optim.AdamW computes them).
#ifndef ZERO_TESTS_ENGINE_REFERENCE_ADAMW_H_
#define ZERO_TESTS_ENGINE_REFERENCE_ADAMW_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "zero/config.h"

namespace zero::testing {

// The gradient rank `rank` contributes for `param` at `step` (fresh values, never zeros).
inline std::vector<float> RankGradient(int param, int64_t numel, int step, int rank) {
  std::mt19937 rng(1000 * step + 10 * param + rank);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> g(numel);
  for (float& x : g) x = dist(rng);
  return g;
}

// A rank's gradient of `param` in micro-batch `micro` of step `step` (fresh values).
inline std::vector<float> MicroGradient(int param, int64_t numel, int step, int micro, int rank) {
  return RankGradient(param, numel, 10 * step + micro, rank);
}

// Step `step`'s gradient of `param` as the optimizer applies it: the `micro_batches`
// micro-batches' MicroGradient summed, averaged over `world` ranks.
inline std::vector<double> WindowGradient(int param, int64_t numel, int step, int micro_batches, int world) {
  std::vector<double> g(numel, 0.0);
  for (int micro = 0; micro < micro_batches; ++micro) {
    for (int r = 0; r < world; ++r) {
      const std::vector<float> part = MicroGradient(param, numel, step, micro, r);
      for (int64_t i = 0; i < numel; ++i) g[i] += static_cast<double>(part[i]) / world;
    }
  }
  return g;
}

inline std::vector<float> InitialValues(int param, int64_t numel) {
  std::mt19937 rng(77 + param);
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  std::vector<float> v(numel);
  for (float& x : v) x = dist(rng);
  return v;
}

// AdamW (lr 1e-2, weight decay 0.1) over `micro_batches` micro-batches per step, the loss
// scaled by the static 2^`loss_scale_power`, buckets of `bucket_elems` (params straddle
// buckets and shards), every stage-3 unit gathered on demand.
inline Config AccumulatingAdamWConfig(int stage, int micro_batches, int loss_scale_power, int64_t bucket_elems) {
  Config c;
  c.stage = stage;
  c.optimizer.type = OptimizerType::kAdamW;
  c.optimizer.lr = 1e-2f;
  c.optimizer.weight_decay = 0.1f;
  c.gradient_accumulation_steps = micro_batches;
  c.loss_scale.mode = LossScaleMode::kStatic;
  c.loss_scale.initial_power = loss_scale_power;
  c.buckets.reduce_bucket_elems = bucket_elems;
  c.buckets.first_bucket_elems = bucket_elems;
  c.buckets.last_bucket_elems = 0;
  c.stage3.persistence_threshold = 0;
  return c;
}

// float64 AdamW on one param, as torch.optim.AdamW.
struct ReferenceAdamW {
  std::vector<double> w, m, v;
  int64_t step = 0;

  explicit ReferenceAdamW(const std::vector<float>& init) : w(init.begin(), init.end()), m(init.size()), v(init.size()) {}
  void Step(const std::vector<double>& g, const OptimizerHyper& h) {
    ++step;
    const double bc1 = 1 - std::pow(static_cast<double>(h.beta1), step);
    const double bc2 = 1 - std::pow(static_cast<double>(h.beta2), step);
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] *= 1 - static_cast<double>(h.lr) * h.weight_decay;
      m[i] = h.beta1 * m[i] + (1 - static_cast<double>(h.beta1)) * g[i];
      v[i] = h.beta2 * v[i] + (1 - static_cast<double>(h.beta2)) * g[i] * g[i];
      w[i] -= h.lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + h.eps);
    }
  }
};

// The averaged gradient over `world` ranks.
inline std::vector<double> MeanGradient(int param, int64_t numel, int step, int world) {
  std::vector<double> mean(numel, 0.0);
  for (int r = 0; r < world; ++r) {
    const std::vector<float> g = RankGradient(param, numel, step, r);
    for (int64_t i = 0; i < numel; ++i) mean[i] += g[i] / world;
  }
  return mean;
}

}  // namespace zero::testing

#endif  // ZERO_TESTS_ENGINE_REFERENCE_ADAMW_H_
