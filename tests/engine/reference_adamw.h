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

inline std::vector<float> InitialValues(int param, int64_t numel) {
  std::mt19937 rng(77 + param);
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  std::vector<float> v(numel);
  for (float& x : v) x = dist(rng);
  return v;
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
