// The MLP, its data, and its hand-written backward pass.
#include "mlp.h"

#include <cmath>
#include <string>

namespace zero::tools {
namespace {

double Uniform(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ a * 0xBF58476D1CE4E5B9ull ^ b * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return static_cast<double>(x >> 11) / 4503599627370496.0 - 1.0;
}

float Decode(const void* p, size_t i, DType dtype) {
  if (dtype == DType::kFP32) return static_cast<const float*>(p)[i];
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  return dtype == DType::kBF16 ? Bf16ToFloat(bits) : HalfToFloat(bits);
}

std::vector<char> Encode(const std::vector<float>& values, DType dtype, float scale) {
  std::vector<char> out(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = values[i] * scale;
    if (dtype == DType::kFP32) {
      reinterpret_cast<float*>(out.data())[i] = v;
    } else {
      reinterpret_cast<uint16_t*>(out.data())[i] = dtype == DType::kBF16 ? FloatToBf16(v) : FloatToHalf(v);
    }
  }
  return out;
}

// y = W x + b for a [n, n] row-major W.
void Affine(const float* w, const float* b, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) {
    float sum = b != nullptr ? b[i] : 0.0f;
    for (int j = 0; j < n; ++j) sum += w[size_t(i) * n + j] * x[j];
    y[i] = sum;
  }
}

}  // namespace

Status Mlp::Setup(Engine& engine) {
  const int64_t n = o_.width;
  int unit = 0;  // one stage-3 unit per layer: its weight and bias
  auto add = [&](const std::string& name, std::vector<int64_t> shape) -> StatusOr<int> {
    ZERO_ASSIGN_OR_RETURN(ParamId id, engine.RegisterParam({name, shape, o_.dtype, true, 0, unit}));
    ids_.push_back(id);
    unit_.push_back(unit);
    numel_.push_back(shape.size() == 2 ? shape[0] * shape[1] : shape[0]);
    return static_cast<int>(ids_.size() - 1);
  };
  for (int l = 0; l < o_.depth; ++l, ++unit) {
    ZERO_RETURN_IF_ERROR(add("layer" + std::to_string(l) + ".weight", {n, n}).status());
    ZERO_RETURN_IF_ERROR(add("layer" + std::to_string(l) + ".bias", {n}).status());
  }
  if (o_.branch) {
    ZERO_ASSIGN_OR_RETURN(branch_, add("branch.weight", {n, n}));
    ++unit;
  }
  if (!o_.tied) {
    ZERO_ASSIGN_OR_RETURN(head_weight_, add("head.weight", {n, n}));
  }
  ZERO_ASSIGN_OR_RETURN(head_bias_, add("head.bias", {n}));
  ZERO_RETURN_IF_ERROR(engine.Finalize());
  for (size_t p = 0; p < ids_.size(); ++p) {
    const bool matrix = numel_[p] == n * n;
    std::vector<float> init(numel_[p]);
    for (int64_t i = 0; i < numel_[p]; ++i) {
      init[i] = static_cast<float>((matrix ? 1.5 / std::sqrt(double(n)) : 0.05) * Uniform(o_.seed, 100 + p, i));
    }
    ZERO_RETURN_IF_ERROR(engine.SetParam(ids_[p], Encode(init, o_.dtype, 1.0f).data()));
  }
  return absl::OkStatus();
}

int Mlp::head_weight() const { return o_.tied ? 0 : head_weight_; }

StatusOr<std::vector<std::vector<float>>> Mlp::ReadParams(Engine& engine) const {
  std::vector<std::vector<float>> params(ids_.size());
  for (size_t p = 0; p < ids_.size(); ++p) {
    const bool first_of_unit = p == 0 || unit_[p] != unit_[p - 1];
    const bool last_of_unit = p + 1 == ids_.size() || unit_[p + 1] != unit_[p];
    if (first_of_unit) ZERO_RETURN_IF_ERROR(engine.Gather(unit_[p]));
    // A host copy (GetParam), so the same code runs on device "cpu" and "cuda".
    std::vector<char> values(static_cast<size_t>(numel_[p]) * DTypeSize(o_.dtype));
    ZERO_RETURN_IF_ERROR(engine.GetParam(ids_[p], values.data()));
    params[p].resize(numel_[p]);
    for (int64_t i = 0; i < numel_[p]; ++i) params[p][i] = Decode(values.data(), i, o_.dtype);
    if (last_of_unit) ZERO_RETURN_IF_ERROR(engine.Release(unit_[p]));
  }
  return params;
}

Status Mlp::Hand(Engine& engine, int param, const std::vector<float>& grad, float scale) const {
  return engine.AccumulateGrad(ids_[param], Encode(grad, o_.dtype, scale).data());
}

StatusOr<double> Mlp::TrainStep(Engine& engine, int step, float loss_scale) {
  const int n = o_.width, depth = o_.depth, rank = engine.rank();
  ZERO_ASSIGN_OR_RETURN(auto w, ReadParams(engine));
  const bool branch_active = branch_ >= 0 && step % 2 == 0;
  const int head = head_weight();
  double loss = 0;
  for (int micro = 0; micro < o_.micro_batches; ++micro) {
    ZERO_RETURN_IF_ERROR(engine.BeginIteration());
    std::vector<std::vector<float>> g(ids_.size());
    for (size_t p = 0; p < ids_.size(); ++p) g[p].assign(numel_[p], 0.0f);
    std::vector<float> g_head_tied;  // the output projection's contribution to layer0.weight
    if (o_.tied) g_head_tied.assign(size_t(n) * n, 0.0f);
    for (int s = micro; s < o_.batch; s += o_.micro_batches) {
      const uint64_t sample = (uint64_t(step) * 100000 + rank) * 1000 + s;
      std::vector<std::vector<float>> h(depth + 1, std::vector<float>(n));
      for (int i = 0; i < n; ++i) h[0][i] = static_cast<float>(Uniform(o_.seed + 7, sample, i));
      for (int l = 0; l < depth; ++l) {
        Affine(w[2 * l].data(), w[2 * l + 1].data(), h[l].data(), h[l + 1].data(), n);
        for (float& v : h[l + 1]) v = std::tanh(v);
      }
      std::vector<float> y(n), dy(n), dh(n, 0.0f);
      if (o_.tied) {  // y = layer0.weightᵀ h + c
        for (int i = 0; i < n; ++i) {
          float sum = w[head_bias_][i];
          for (int j = 0; j < n; ++j) sum += w[0][size_t(j) * n + i] * h[depth][j];
          y[i] = sum;
        }
      } else {
        Affine(w[head].data(), w[head_bias_].data(), h[depth].data(), y.data(), n);
      }
      std::vector<float> extra(n, 0.0f);
      if (branch_active) Affine(w[branch_].data(), nullptr, h[depth].data(), extra.data(), n);
      for (int i = 0; i < n; ++i) {
        double teacher = 0;
        for (int j = 0; j < n; j += 4) teacher += Uniform(o_.seed + 3, i, j) * h[0][j];
        const float e = y[i] + extra[i] - static_cast<float>(std::tanh(teacher));
        loss += 0.5 * double(e) * e;
        dy[i] = e / o_.batch;
      }
      // Backward.
      for (int i = 0; i < n; ++i) {
        g[head_bias_][i] += dy[i];
        for (int j = 0; j < n; ++j) {
          if (o_.tied) {
            g_head_tied[size_t(j) * n + i] += dy[i] * h[depth][j];
            dh[j] += w[0][size_t(j) * n + i] * dy[i];
          } else {
            g[head][size_t(i) * n + j] += dy[i] * h[depth][j];
            dh[j] += w[head][size_t(i) * n + j] * dy[i];
          }
          if (branch_active) {
            g[branch_][size_t(i) * n + j] += dy[i] * h[depth][j];
            dh[j] += w[branch_][size_t(i) * n + j] * dy[i];
          }
        }
      }
      for (int l = depth - 1; l >= 0; --l) {
        std::vector<float> dz(n), dprev(n, 0.0f);
        for (int i = 0; i < n; ++i) dz[i] = dh[i] * (1.0f - h[l + 1][i] * h[l + 1][i]);
        for (int i = 0; i < n; ++i) {
          g[2 * l + 1][i] += dz[i];
          for (int j = 0; j < n; ++j) {
            g[2 * l][size_t(i) * n + j] += dz[i] * h[l][j];
            dprev[j] += w[2 * l][size_t(i) * n + j] * dz[i];
          }
        }
        dh.swap(dprev);
      }
    }
    // Hand the gradients over in backward order (the loss is scaled for fp16).
    ZERO_RETURN_IF_ERROR(Hand(engine, head_bias_, g[head_bias_], loss_scale));
    if (o_.tied) {
      ZERO_RETURN_IF_ERROR(Hand(engine, 0, g_head_tied, loss_scale));  // first use of layer0.weight
    } else {
      ZERO_RETURN_IF_ERROR(Hand(engine, head, g[head], loss_scale));
    }
    if (branch_active) {
      ZERO_RETURN_IF_ERROR(Hand(engine, branch_, g[branch_], loss_scale));
    } else if (branch_ >= 0) {  // the forward left it out: its bucket need not wait for EndBackward
      ZERO_RETURN_IF_ERROR(engine.GradAbsent(ids_[branch_]));
    }
    const int recomputed = depth / 2;
    for (int l = depth - 1; l >= 0; --l) {
      ZERO_RETURN_IF_ERROR(engine.Gather(unit_[2 * l]));  // backward needs the layer's weights again
      ZERO_RETURN_IF_ERROR(Hand(engine, 2 * l + 1, g[2 * l + 1], loss_scale));
      if (o_.recompute && l == recomputed) {  // the hook fires again for the recomputed segment
        ZERO_RETURN_IF_ERROR(Hand(engine, 2 * l, g[2 * l], 0.5f * loss_scale));
        ZERO_RETURN_IF_ERROR(Hand(engine, 2 * l, g[2 * l], 0.5f * loss_scale));
      } else {
        ZERO_RETURN_IF_ERROR(Hand(engine, 2 * l, g[2 * l], loss_scale));
      }
      ZERO_RETURN_IF_ERROR(engine.Release(unit_[2 * l]));
    }
    ZERO_RETURN_IF_ERROR(engine.EndBackward());
  }
  return loss / o_.batch;
}

StatusOr<double> Mlp::Checksum(Engine& engine) const {
  ZERO_ASSIGN_OR_RETURN(auto params, ReadParams(engine));
  double sum = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    for (size_t i = 0; i < params[p].size(); ++i) sum += params[p][i] * (1.0 + 1e-3 * double((i + p) % 13));
  }
  return sum;
}

}  // namespace zero::tools
