// Argument checks shared by the CPU kernel launchers.
#include "kernels/launch_checks.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace zero::kernels {

Status CheckSegments(const char* kernel, SegmentTypes types, absl::Span<const Segment> segments,
                     SegmentNeeds needs) {
  if (!IsFloatingPoint(types.param) || !IsFloatingPoint(types.grad)) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": params and gradients must be fp32, bf16 or "
                                                   "fp16, not ", DTypeName(types.param), " and ",
                                                   DTypeName(types.grad)));
  }
  const bool low_precision = types.param != DType::kFP32;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    auto fail = [&](const char* what) {
      return absl::InvalidArgumentError(absl::StrCat(kernel, ": segment ", i, " (numel ", s.numel,
                                                     "): ", what));
    };
    if (s.numel < 0) return fail("negative numel");
    if (s.numel == 0) continue;
    if (s.master == nullptr) return fail("master weights pointer is null");
    if (needs.grad && s.grad == nullptr) return fail("grad pointer is null");
    if (needs.state0 && s.state0 == nullptr) return fail("state0 (first moment) pointer is null");
    if (needs.state1 && s.state1 == nullptr) return fail("state1 (second moment) pointer is null");
    if (low_precision && s.model_param == nullptr) {
      return fail(absl::StrCat("param type is ", DTypeName(types.param),
                               " but the low-precision model_param pointer is null")
                      .c_str());
    }
    if (!low_precision && s.model_param != nullptr) {
      return fail("param type is fp32 (master weights are the params) but model_param is set");
    }
  }
  return absl::OkStatus();
}

Status CheckRange(const char* kernel, const char* name, double value, double low, double high,
                  bool high_open) {
  const bool inside = std::isfinite(value) && value >= low && (high_open ? value < high : value <= high);
  if (inside) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(kernel, ": ", name, " = ", value,
                                                 " is outside [", low, ", ", high,
                                                 high_open ? ")" : "]"));
}

Status CheckCommon(const char* kernel, const StepCommon& common) {
  return CheckRange(kernel, "grad_scale", common.grad_scale, -std::numeric_limits<float>::max(),
                    std::numeric_limits<float>::max());
}

Status CheckStep(const char* kernel, int64_t step) {
  if (step >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(kernel, ": step = ", step,
                                                 " must be ≥ 1 (the count including this step)"));
}

Status CheckAdam(const char* kernel, const AdamHyper& h, SegmentTypes types, absl::Span<const Segment> segments) {
  ZERO_RETURN_IF_ERROR(CheckSegments(kernel, types, segments, {true, true, true}));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "lr", h.lr, 0, 1e6));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "beta1", h.beta1, 0, 1, true));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "beta2", h.beta2, 0, 1, true));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "eps", h.eps, 0, 1e6));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "weight_decay", h.weight_decay, 0, 1e6));
  ZERO_RETURN_IF_ERROR(CheckStep(kernel, h.step));
  return CheckCommon(kernel, h.common);
}

Status CheckSgd(const char* kernel, const SgdHyper& h, SegmentTypes types, absl::Span<const Segment> segments) {
  ZERO_RETURN_IF_ERROR(CheckSegments(kernel, types, segments, {true, h.momentum != 0.0f, false}));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "lr", h.lr, 0, 1e6));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "momentum", h.momentum, 0, 1));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "dampening", h.dampening, 0, 1));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "weight_decay", h.weight_decay, 0, 1e6));
  ZERO_RETURN_IF_ERROR(CheckStep(kernel, h.step));
  ZERO_RETURN_IF_ERROR(CheckCommon(kernel, h.common));
  if (h.nesterov && (h.momentum == 0.0f || h.dampening != 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel, ": nesterov requires momentum > 0 and dampening = 0 (as torch.optim.SGD)"));
  }
  return absl::OkStatus();
}

Status CheckLion(const char* kernel, const LionHyper& h, SegmentTypes types, absl::Span<const Segment> segments) {
  ZERO_RETURN_IF_ERROR(CheckSegments(kernel, types, segments, {true, true, false}));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "lr", h.lr, 0, 1e6));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "beta1", h.beta1, 0, 1));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "beta2", h.beta2, 0, 1));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "weight_decay", h.weight_decay, 0, 1e6));
  return CheckCommon(kernel, h.common);
}

Status CheckLambUpdate(const char* kernel, const LambHyper& h, SegmentTypes types,
                       absl::Span<const Segment> segments, absl::Span<float* const> updates) {
  ZERO_RETURN_IF_ERROR(CheckSegments(kernel, types, segments, {true, true, true}));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "beta1", h.beta1, 0, 1, true));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "beta2", h.beta2, 0, 1, true));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "eps", h.eps, 0, 1e6));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "weight_decay", h.weight_decay, 0, 1e6));
  ZERO_RETURN_IF_ERROR(CheckStep(kernel, h.step));
  ZERO_RETURN_IF_ERROR(CheckCommon(kernel, h.common));
  if (updates.size() != segments.size()) {
    return absl::InvalidArgumentError(absl::StrCat(kernel, ": ", updates.size(),
                                                   " update buffers for ", segments.size(),
                                                   " segments"));
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].numel > 0 && updates[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(kernel, ": update buffer ", i, " is null"));
    }
  }
  return absl::OkStatus();
}

Status CheckLambApply(const char* kernel, const LambHyper& h, DType param_type,
                      absl::Span<const Segment> segments, absl::Span<const float* const> updates,
                      absl::Span<const float> trust_ratios) {
  ZERO_RETURN_IF_ERROR(CheckSegments(kernel, {param_type, DType::kFP32}, segments, {false, false, false}));
  ZERO_RETURN_IF_ERROR(CheckRange(kernel, "lr", h.lr, 0, 1e6));
  if (updates.size() != segments.size() || trust_ratios.size() != segments.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kernel, ": ", segments.size(), " segments need as many update buffers (got ",
        updates.size(), ") and trust ratios (got ", trust_ratios.size(), ")"));
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].numel > 0 && updates[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(kernel, ": update buffer ", i, " is null"));
    }
    ZERO_RETURN_IF_ERROR(CheckRange(kernel, "trust ratio", trust_ratios[i], 0, 1e30));
  }
  return absl::OkStatus();
}

}  // namespace zero::kernels
