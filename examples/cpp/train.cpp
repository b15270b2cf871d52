// Embedding ZeroRT from C++: a trainer with its own model code hands parameters and gradients
// to the engine. Four in-process ranks fit y = 3x - 1 by least squares (SGD with momentum)
// at stage 2.
//
// Built against the installed package (find_package(ZeroRT) → ZeroRT::zerort).
#include <zero/communicator.h>
#include <zero/engine.h>

#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

int main() {
  constexpr int kRanks = 4, kSteps = 400;
  auto group = zero::comm::CreateLocalGroup(kRanks);
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
    return 1;
  }
  std::vector<float> final_loss(kRanks, -1.0f);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      zero::Config config;
      config.stage = 2;
      config.optimizer.type = zero::OptimizerType::kSgd;
      config.optimizer.lr = 0.02f;
      config.optimizer.momentum = 0.9f;
      config.optimizer.weight_decay = 0.0f;
      auto engine = zero::Engine::Create(config, *(*group)[r]);
      if (!engine.ok()) return;
      zero::Engine& e = **engine;
      const zero::ParamId w = *e.RegisterParam({"w", {1}});
      const zero::ParamId b = *e.RegisterParam({"b", {1}});
      if (!e.Finalize().ok()) return;
      for (int step = 0; step < kSteps; ++step) {
        const float wv = *static_cast<float*>(*e.ParamData(w));
        const float bv = *static_cast<float*>(*e.ParamData(b));
        // This rank's sample: x = r / kRanks + step % 3, target 3x - 1.
        const float x = static_cast<float>(r) / kRanks + step % 3, err = wv * x + bv - (3 * x - 1);
        if (!e.BeginIteration().ok()) return;
        *static_cast<float*>(*e.GradBuffer(b)) += err;  // backward order: b, then w
        if (!e.GradReady(b).ok()) return;
        *static_cast<float*>(*e.GradBuffer(w)) += err * x;
        if (!e.GradReady(w).ok() || !e.EndBackward().ok() || !e.Step().ok()) return;
        final_loss[r] = 0.5f * err * err;
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    std::printf("rank %d: final loss %.6f\n", r, final_loss[r]);
    if (!(final_loss[r] >= 0.0f && final_loss[r] < 1e-3f)) return 1;
  }
  return 0;
}
