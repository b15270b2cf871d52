// Helpers for the CPU kernel tests.
#include "tests/unit/kernel_test_util.h"

#include <cmath>

#include "base/cpu_isa.h"
#include "zero/dtype.h"

namespace zero::testing {

SegmentStorage::SegmentStorage(int64_t numel, SegmentTypes types, std::mt19937_64& rng)
    : master(numel), state0(numel), state1(numel) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> spread(0.25f, 4.0f);
  for (int64_t i = 0; i < numel; ++i) {
    master[i] = unit(rng);
    state0[i] = 0.1f * unit(rng);
    state1[i] = state0[i] * state0[i] * spread(rng) + 1e-6f;
  }
  if (types.param != DType::kFP32) model_param.assign(numel, 0xffff);
  if (types.grad == DType::kFP32) {
    grad32.resize(numel);
    for (auto& g : grad32) g = unit(rng);
  } else {
    grad16.resize(numel);
    for (auto& g : grad16) g = ToLowPrecision(unit(rng), types.grad);
  }
}

float SegmentStorage::Grad(int64_t i, DType dtype) const {
  switch (dtype) {
    case DType::kFP32: return grad32[i];
    case DType::kBF16: return Bf16ToFloat(grad16[i]);
    case DType::kFP16: return HalfToFloat(grad16[i]);
    case DType::kInt64:
    case DType::kUInt8: break;  // no kernel takes them
  }
  return NAN;
}

Segment SegmentStorage::View() {
  Segment s;
  s.master = master.data();
  s.model_param = model_param.empty() ? nullptr : model_param.data();
  s.grad = grad32.empty() ? static_cast<const void*>(grad16.data()) : grad32.data();
  s.state0 = state0.data();
  s.state1 = state1.data();
  s.numel = static_cast<int64_t>(master.size());
  return s;
}

std::vector<base::CpuIsa> SupportedIsas() {
  std::vector<base::CpuIsa> isas;
  for (int i = 0; i <= static_cast<int>(base::DetectCpuIsa()); ++i) {
    isas.push_back(static_cast<base::CpuIsa>(i));
  }
  return isas;
}

std::vector<SegmentTypes> AllTypeCombinations() {
  std::vector<SegmentTypes> all;
  for (DType param : {DType::kFP32, DType::kBF16, DType::kFP16}) {
    for (DType grad : {DType::kFP32, DType::kBF16, DType::kFP16}) all.push_back({param, grad});
  }
  return all;
}

std::string Describe(base::CpuIsa isa, SegmentTypes types) {
  return std::string(base::CpuIsaName(isa)) + "/param=" + DTypeName(types.param) +
         "/grad=" + DTypeName(types.grad);
}

uint16_t ToLowPrecision(float value, DType dtype) {
  return dtype == DType::kBF16 ? FloatToBf16(value) : FloatToHalf(value);
}

// torch.optim.Adam / AdamW, one element, in float64.
bool AdamReference(const kernels::AdamHyper& h, double& w, double& m, double& v, double g) {
  g *= h.common.grad_scale;
  if (h.decoupled_weight_decay) {
    w *= 1.0 - double{h.lr} * h.weight_decay;
  } else {
    g += double{h.weight_decay} * w;
  }
  m = h.beta1 * m + (1.0 - h.beta1) * g;
  v = h.beta2 * v + (1.0 - h.beta2) * g * g;
  const double bc1 = 1.0 - std::pow(double{h.beta1}, h.step);
  const double bc2 = 1.0 - std::pow(double{h.beta2}, h.step);
  w -= h.lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + h.eps);
  return true;
}

// torch.optim.SGD, one element, in float64.
bool SgdReference(const kernels::SgdHyper& h, double& w, double& buf, double g) {
  g = g * h.common.grad_scale + double{h.weight_decay} * w;
  if (h.momentum != 0.0f) {
    buf = h.step == 1 ? g : h.momentum * buf + (1.0 - h.dampening) * g;
    g = h.nesterov ? g + double{h.momentum} * buf : buf;
  }
  w -= double{h.lr} * g;
  return true;
}

LambExpected LambReference(const kernels::LambHyper& h, const SegmentStorage& init, DType grad_type) {
  const int64_t n = static_cast<int64_t>(init.master.size());
  const double bc1 = 1.0 - std::pow(double{h.beta1}, h.step);
  const double bc2 = 1.0 - std::pow(double{h.beta2}, h.step);
  LambExpected out;
  std::vector<double> u(n);
  out.m.resize(n);
  out.v.resize(n);
  double w_sq = 0, u_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = init.Grad(i, grad_type) * double{h.common.grad_scale};
    out.m[i] = h.beta1 * init.state0[i] + (1.0 - h.beta1) * g;
    out.v[i] = h.beta2 * init.state1[i] + (1.0 - h.beta2) * g * g;
    u[i] = (out.m[i] / bc1) / (std::sqrt(out.v[i] / bc2) + h.eps) + h.weight_decay * init.master[i];
    w_sq += double{init.master[i]} * init.master[i];
    u_sq += u[i] * u[i];
  }
  const double ratio = std::sqrt(w_sq) / std::sqrt(u_sq);
  out.weight.resize(n);
  for (int64_t i = 0; i < n; ++i) out.weight[i] = init.master[i] - h.lr * ratio * u[i];
  return out;
}

}  // namespace zero::testing
