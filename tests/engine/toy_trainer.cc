// The toy trainer: model, data, gradients by hand, and a float64 reference.
#include "tests/engine/toy_trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/raw_memory.h"
#include "tests/engine/run_on_ranks.h"

namespace zero::testing {
namespace {

// Deterministic uniform value in [-1, 1) for (seed, a, b, c).
double Uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ a * 0xBF58476D1CE4E5B9ull ^ b * 0x94D049BB133111EBull ^
               c * 0xD6E8FEB86659FD93ull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return static_cast<double>(x >> 11) / 4503599627370496.0 - 1.0;
}

// Params in registration order: W1 [hidden, inputs], b1 [hidden], W2 [outputs, hidden], b2.
struct Shapes {
  int in, h, out;
  std::vector<int64_t> Numel() const { return {int64_t{h} * in, h, int64_t{out} * h, out}; }
};

template <typename T>
struct Model {
  std::vector<T> w1, b1, w2, b2;
};

template <typename T>
Model<T> InitialModel(const ToyOptions& o) {
  Model<T> m;
  auto fill = [&](std::vector<T>& v, size_t n, int which, double scale) {
    v.resize(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(scale * Uniform(o.seed, 1, which, i));
  };
  fill(m.w1, size_t(o.hidden) * o.inputs, 0, 1.0 / std::sqrt(o.inputs));
  fill(m.b1, o.hidden, 1, 0.1);
  fill(m.w2, size_t(o.outputs) * o.hidden, 2, 1.0 / std::sqrt(o.hidden));
  fill(m.b2, o.outputs, 3, 0.1);
  return m;
}

double Input(const ToyOptions& o, int step, int sample, int i) { return Uniform(o.seed, 2, step * 1000 + sample, i); }

// The teacher: a fixed random linear-tanh map.
double Target(const ToyOptions& o, int step, int sample, int k) {
  double s = 0;
  for (int i = 0; i < o.inputs; ++i) s += Uniform(o.seed, 3, k, i) * Input(o, step, sample, i);
  return std::tanh(s);
}

// Forward + backward of one sample, accumulating `scale` × gradients; returns 0.5‖y − t‖².
template <typename T>
double SampleGrad(const ToyOptions& o, const Model<T>& m, int step, int sample, T scale, Model<T>* g) {
  std::vector<T> x(o.inputs), h(o.hidden), y(o.outputs), dy(o.outputs), dh(o.hidden, 0);
  for (int i = 0; i < o.inputs; ++i) x[i] = static_cast<T>(Input(o, step, sample, i));
  for (int j = 0; j < o.hidden; ++j) {
    T z = m.b1[j];
    for (int i = 0; i < o.inputs; ++i) z += m.w1[size_t(j) * o.inputs + i] * x[i];
    h[j] = std::tanh(z);
  }
  double loss = 0;
  for (int k = 0; k < o.outputs; ++k) {
    T z = m.b2[k];
    for (int j = 0; j < o.hidden; ++j) z += m.w2[size_t(k) * o.hidden + j] * h[j];
    const T e = z - static_cast<T>(Target(o, step, sample, k));
    loss += 0.5 * double(e) * double(e);
    dy[k] = e * scale;
  }
  if (g == nullptr) return loss;
  for (int k = 0; k < o.outputs; ++k) {
    g->b2[k] += dy[k];
    for (int j = 0; j < o.hidden; ++j) {
      g->w2[size_t(k) * o.hidden + j] += dy[k] * h[j];
      dh[j] += m.w2[size_t(k) * o.hidden + j] * dy[k];
    }
  }
  for (int j = 0; j < o.hidden; ++j) {
    const T dz = dh[j] * (T(1) - h[j] * h[j]);
    g->b1[j] += dz;
    for (int i = 0; i < o.inputs; ++i) g->w1[size_t(j) * o.inputs + i] += dz * x[i];
  }
  return loss;
}

template <typename T>
Model<T> Zeros(const ToyOptions& o) {
  Model<T> z;
  z.w1.assign(size_t(o.hidden) * o.inputs, 0);
  z.b1.assign(o.hidden, 0);
  z.w2.assign(size_t(o.outputs) * o.hidden, 0);
  z.b2.assign(o.outputs, 0);
  return z;
}

float Decode(const void* p, size_t i, DType dtype) {
  if (dtype == DType::kFP32) return static_cast<const float*>(p)[i];
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  return dtype == DType::kBF16 ? Bf16ToFloat(bits) : HalfToFloat(bits);
}

void Encode(void* p, size_t i, DType dtype, float value) {
  if (dtype == DType::kFP32) {
    static_cast<float*>(p)[i] = value;
  } else {
    static_cast<uint16_t*>(p)[i] = dtype == DType::kBF16 ? FloatToBf16(value) : FloatToHalf(value);
  }
}

// A host copy of an engine view, which is device memory on device "cuda".
StatusOr<std::vector<char>> ReadView(const void* view, size_t bytes) {
  std::vector<char> out(bytes);
  ZERO_RETURN_IF_ERROR(base::CopyBytes(out.data(), view, static_cast<int64_t>(bytes)));
  return out;
}

// The caller's device work (ToyOptions::device_work), if any.
Status DeviceWork(const ToyOptions& o) { return o.device_work ? o.device_work() : absl::OkStatus(); }

}  // namespace

Config ToyConfig(int stage) {
  Config c;
  c.stage = stage;
  c.optimizer.type = OptimizerType::kAdamW;
  c.optimizer.lr = 1e-2f;
  c.optimizer.weight_decay = 0.01f;
  c.buckets.first_bucket_elems = 200;  // several buckets; params straddle shard boundaries
  c.buckets.reduce_bucket_elems = 300;
  c.buckets.pool_buffers = 2;
  c.guard.timeout_s = 60;
  c.stage3.persistence_threshold = 0;
  return c;
}

StatusOr<std::vector<ParamId>> RegisterToyModel(Engine& engine, const ToyOptions& o) {
  const std::vector<std::vector<int64_t>> dims = {
      {o.hidden, o.inputs}, {o.hidden}, {o.outputs, o.hidden}, {o.outputs}};
  const char* names[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  std::vector<ParamId> ids;
  for (int p = 0; p < 4; ++p) {
    // Each layer is a stage-3 unit (ignored at stages 0-2).
    const int group = p % 2 == 1 ? o.bias_group : 0;
    ZERO_ASSIGN_OR_RETURN(ParamId id, engine.RegisterParam({names[p], dims[p], o.dtype, true, group, p / 2}));
    ids.push_back(id);
  }
  ZERO_RETURN_IF_ERROR(engine.Finalize());
  return ids;
}

Status TrainToy(Engine& engine, const ToyOptions& o, ToyResult* result) {
  const Shapes shapes{o.inputs, o.hidden, o.outputs};
  ZERO_ASSIGN_OR_RETURN(const std::vector<ParamId> ids, RegisterToyModel(engine, o));
  const Model<float> init = InitialModel<float>(o);
  const std::vector<const std::vector<float>*> init_parts = {&init.w1, &init.b1, &init.w2, &init.b2};
  const std::vector<int64_t> numel = shapes.Numel();
  for (int p = 0; p < 4; ++p) {
    std::vector<char> encoded(numel[p] * DTypeSize(o.dtype));
    for (int64_t i = 0; i < numel[p]; ++i) Encode(encoded.data(), i, o.dtype, (*init_parts[p])[i]);
    ZERO_RETURN_IF_ERROR(engine.SetParam(ids[p], encoded.data()));
  }
  if (!o.load_dir.empty()) ZERO_RETURN_IF_ERROR(engine.LoadCheckpoint(o.load_dir));
  if (o.after_setup) ZERO_RETURN_IF_ERROR(o.after_setup(engine));
  const int world = engine.world_size(), rank = engine.rank();
  std::vector<std::vector<float>> last_unit0(2);
  const int local = o.global_batch / world;
  for (int step = o.first_step; step < o.first_step + o.steps; ++step) {
    // Forward: the current params, decoded from the engine's full views, unit by unit.
    Model<float> m = Zeros<float>(o);
    std::vector<std::vector<float>*> parts = {&m.w1, &m.b1, &m.w2, &m.b2};
    for (int unit = 0; unit < 2; ++unit) {
      if (!o.skip_unit0_on_odd_steps || unit != 0 || step % 2 == 0) ZERO_RETURN_IF_ERROR(engine.Gather(unit));
      for (int p = 2 * unit; p < 2 * unit + 2; ++p) {
        if (o.skip_unit0_on_odd_steps && unit == 0 && step % 2 == 1) {
          *parts[p] = last_unit0[p];  // data-dependent control flow: this step reuses the cached layer
          continue;
        }
        ZERO_ASSIGN_OR_RETURN(void* view, engine.ParamData(ids[p]));
        ZERO_RETURN_IF_ERROR(DeviceWork(o));
        ZERO_ASSIGN_OR_RETURN(std::vector<char> values, ReadView(view, numel[p] * DTypeSize(o.dtype)));
        for (int64_t i = 0; i < numel[p]; ++i) (*parts[p])[i] = Decode(values.data(), i, o.dtype);
        if (unit == 0) last_unit0[p] = *parts[p];
      }
      if (!o.skip_unit0_on_odd_steps || unit != 0 || step % 2 == 0) ZERO_RETURN_IF_ERROR(engine.Release(unit));
    }
    double loss = 0;
    for (int s = 0; s < o.global_batch; ++s) loss += SampleGrad<float>(o, m, step, s, 0, nullptr);
    result->losses.push_back(loss / o.global_batch);

    // Micro-batch k takes every micro_batches-th sample of the local slice; gradients are
    // scaled by 1/local so that the micro-batches sum to the local mean.
    std::vector<std::vector<char>> lent;  // lend_grads: each gradient handed over this step
    for (int k = 0; k < o.micro_batches; ++k) {
      ZERO_RETURN_IF_ERROR(engine.BeginIteration());
      Model<float> g = Zeros<float>(o);
      for (int s = rank * local + k; s < (rank + 1) * local; s += o.micro_batches) {
        SampleGrad<float>(o, m, step, s, 1.0f / local, &g);
      }
      std::vector<std::vector<float>*> gparts = {&g.w1, &g.b1, &g.w2, &g.b2};
      // Backward: layer 2's unit, then layer 1's, gathered again as a ZeRO-3 backward does.
      for (int p = 3; p >= 0; --p) {
        if (p == 3 || p == 1) ZERO_RETURN_IF_ERROR(engine.Gather(p / 2));
        if (o.lend_grads) {
          std::vector<char>& encoded = lent.emplace_back(numel[p] * DTypeSize(o.dtype));
          for (int64_t i = 0; i < numel[p]; ++i) Encode(encoded.data(), i, o.dtype, (*gparts[p])[i]);
          ZERO_RETURN_IF_ERROR(engine.LendGrad(ids[p], encoded.data(), Placement::kHost).status());
          if (p == 0 || p == 2) ZERO_RETURN_IF_ERROR(engine.Release(p / 2));
          continue;
        }
        if (p == 2) {  // one param through AccumulateGrad, the others through GradBuffer
          std::vector<char> encoded(numel[p] * DTypeSize(o.dtype));
          for (int64_t i = 0; i < numel[p]; ++i) Encode(encoded.data(), i, o.dtype, (*gparts[p])[i]);
          ZERO_RETURN_IF_ERROR(engine.AccumulateGrad(ids[p], encoded.data()));
          ZERO_RETURN_IF_ERROR(DeviceWork(o));  // before `encoded` is freed
          ZERO_RETURN_IF_ERROR(engine.Release(p / 2));
          continue;
        }
        ZERO_ASSIGN_OR_RETURN(void* view, engine.GradBuffer(ids[p]));
        ZERO_RETURN_IF_ERROR(DeviceWork(o));
        ZERO_ASSIGN_OR_RETURN(std::vector<char> grad, ReadView(view, numel[p] * DTypeSize(o.dtype)));
        for (int64_t i = 0; i < numel[p]; ++i) {
          Encode(grad.data(), i, o.dtype, Decode(grad.data(), i, o.dtype) + (*gparts[p])[i]);
        }
        ZERO_RETURN_IF_ERROR(base::CopyBytes(view, grad.data(), static_cast<int64_t>(grad.size())));
        ZERO_RETURN_IF_ERROR(engine.GradReady(ids[p]));
        if (p == 0 || p == 2) ZERO_RETURN_IF_ERROR(engine.Release(p / 2));
      }
      ZERO_RETURN_IF_ERROR(engine.EndBackward());
    }
    ZERO_ASSIGN_OR_RETURN(StepInfo info, engine.Step());
    result->infos.push_back(info);
    if (!lent.empty()) {  // freed as a GPU trainer frees: after the work queued on the stream
      ZERO_RETURN_IF_ERROR(DeviceWork(o));
      for (std::vector<char>& grad : lent) std::fill(grad.begin(), grad.end(), static_cast<char>(0xFF));  // NaN
    }
    if (step == o.save_after) ZERO_RETURN_IF_ERROR(engine.SaveCheckpoint(o.save_dir));
  }
  result->final_params.assign(4, {});
  for (int p = 0; p < 4; ++p) {
    std::vector<char> out(numel[p] * DTypeSize(o.dtype));
    ZERO_RETURN_IF_ERROR(engine.GetParam(ids[p], out.data()));
    for (int64_t i = 0; i < numel[p]; ++i) result->final_params[p].push_back(Decode(out.data(), i, o.dtype));
  }
  return absl::OkStatus();
}

std::vector<double> ReferenceLosses(const ToyOptions& o, const Config& config) {
  Model<double> m = InitialModel<double>(o);
  Model<double> exp_avg = Zeros<double>(o), exp_avg_sq = Zeros<double>(o);
  const OptimizerConfig& opt = config.optimizer;
  std::vector<double> losses;
  for (int step = 0; step < o.steps; ++step) {
    Model<double> g = Zeros<double>(o);
    double loss = 0;
    for (int s = 0; s < o.global_batch; ++s) loss += SampleGrad<double>(o, m, step, s, 1.0 / o.global_batch, &g);
    losses.push_back(loss / o.global_batch);
    const int t = step + 1;
    const double bc1 = 1 - std::pow(double(opt.beta1), t), bc2 = 1 - std::pow(double(opt.beta2), t);
    auto update = [&](std::vector<double>& w, const std::vector<double>& grad, std::vector<double>& mm,
                      std::vector<double>& vv) {
      if (opt.type == OptimizerType::kLamb) {  // NVIDIA FusedLAMB: trust ratio per param tensor
        std::vector<double> u(w.size());
        double w_sq = 0, u_sq = 0;
        for (size_t i = 0; i < w.size(); ++i) {
          mm[i] = opt.beta1 * mm[i] + (1 - opt.beta1) * grad[i];
          vv[i] = opt.beta2 * vv[i] + (1 - opt.beta2) * grad[i] * grad[i];
          u[i] = (mm[i] / bc1) / (std::sqrt(vv[i] / bc2) + opt.eps) + opt.weight_decay * w[i];
          w_sq += w[i] * w[i];
          u_sq += u[i] * u[i];
        }
        const double ratio = (w_sq > 0 && u_sq > 0) ? std::sqrt(w_sq) / std::sqrt(u_sq) : 1.0;
        for (size_t i = 0; i < w.size(); ++i) w[i] -= opt.lr * ratio * u[i];
        return;
      }
      for (size_t i = 0; i < w.size(); ++i) {
        w[i] *= 1 - double(opt.lr) * opt.weight_decay;
        mm[i] = opt.beta1 * mm[i] + (1 - opt.beta1) * grad[i];
        vv[i] = opt.beta2 * vv[i] + (1 - opt.beta2) * grad[i] * grad[i];
        w[i] -= opt.lr / bc1 * mm[i] / (std::sqrt(vv[i]) / std::sqrt(bc2) + opt.eps);
      }
    };
    update(m.w1, g.w1, exp_avg.w1, exp_avg_sq.w1);
    update(m.b1, g.b1, exp_avg.b1, exp_avg_sq.b1);
    update(m.w2, g.w2, exp_avg.w2, exp_avg_sq.w2);
    update(m.b2, g.b2, exp_avg.b2, exp_avg_sq.b2);
  }
  return losses;
}

std::vector<RankRun> TrainOnLocalRanks(int world, const Config& config, const ToyOptions& options) {
  std::vector<RankRun> runs(world);
  const std::vector<Status> statuses = RunOnRanks(world, [&](int r, comm::Communicator& comm) -> Status {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, comm));
    const Status trained = TrainToy(*engine, options, &runs[r].result);
    runs[r].memory = engine->GetMemoryStats();
    runs[r].counters = engine->counters();
    return trained;
  });
  for (int r = 0; r < world; ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  return runs;
}

}  // namespace zero::testing
