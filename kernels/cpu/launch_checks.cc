// Argument checks shared by the CPU kernel launchers.
#include "kernels/cpu/launch_checks.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace zero::kernels::cpu {

Status CheckExec(const CpuExec& exec) {
  if (exec.isa > base::DetectCpuIsa()) {
    return absl::InvalidArgumentError(absl::StrCat("CPU ISA ", base::CpuIsaName(exec.isa),
                                                   " requested, but this CPU supports at most ",
                                                   base::CpuIsaName(base::DetectCpuIsa())));
  }
  if (exec.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("thread count ", exec.threads, " is negative"));
  }
  return absl::OkStatus();
}

Status CheckSegments(const char* kernel, SegmentTypes types, absl::Span<const Segment> segments,
                     SegmentNeeds needs) {
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

}  // namespace zero::kernels::cpu
