// CPU optimizer launchers: check arguments, compute the step's scalars once, run the loop of
// the chosen instruction set.
#include "kernels/cpu/optimizers.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/isa/dispatch.h"
#include "kernels/launch_checks.h"

namespace zero::kernels {
namespace {

// The CPU loops take no squares in the step: SquaredNormsCpu is their one read of the gradients.
Status NoSquaresInStep(const char* kernel, const StepCommon& common) {
  if (common.grad_squares == nullptr) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      kernel, ": StepCommon::grad_squares is not implemented by the CPU kernels; take the norm with "
      "SquaredNormsCpu before the step"));
}

}  // namespace

Status AdamStepCpu(const AdamHyper& h, SegmentTypes types, absl::Span<const Segment> segments,
                   const CpuExec& exec) {
  ZERO_RETURN_IF_ERROR(CheckExec(exec));
  ZERO_RETURN_IF_ERROR(NoSquaresInStep("AdamStepCpu", h.common));
  ZERO_RETURN_IF_ERROR(CheckAdam("AdamStepCpu", h, types, segments));
  if (Skipped(h.common)) return absl::OkStatus();

  const AdamCoeffs c = MakeAdamCoeffs(WithHostGradScale(h));
  ZERO_ISA_DISPATCH(exec.isa, AdamLoop, c, types, segments.data(),
                    static_cast<int64_t>(segments.size()), exec.threads);
  return absl::OkStatus();
}

Status SgdStepCpu(const SgdHyper& h, SegmentTypes types, absl::Span<const Segment> segments,
                  const CpuExec& exec) {
  ZERO_RETURN_IF_ERROR(CheckExec(exec));
  ZERO_RETURN_IF_ERROR(NoSquaresInStep("SgdStepCpu", h.common));
  ZERO_RETURN_IF_ERROR(CheckSgd("SgdStepCpu", h, types, segments));
  if (Skipped(h.common)) return absl::OkStatus();

  const SgdCoeffs c = MakeSgdCoeffs(WithHostGradScale(h));
  ZERO_ISA_DISPATCH(exec.isa, SgdLoop, c, types, segments.data(),
                    static_cast<int64_t>(segments.size()), exec.threads);
  return absl::OkStatus();
}

Status LionStepCpu(const LionHyper& h, SegmentTypes types, absl::Span<const Segment> segments,
                   const CpuExec& exec) {
  ZERO_RETURN_IF_ERROR(CheckExec(exec));
  ZERO_RETURN_IF_ERROR(NoSquaresInStep("LionStepCpu", h.common));
  ZERO_RETURN_IF_ERROR(CheckLion("LionStepCpu", h, types, segments));
  if (Skipped(h.common)) return absl::OkStatus();

  const LionCoeffs c = MakeLionCoeffs(WithHostGradScale(h));
  ZERO_ISA_DISPATCH(exec.isa, LionLoop, c, types, segments.data(),
                    static_cast<int64_t>(segments.size()), exec.threads);
  return absl::OkStatus();
}

Status LambUpdateCpu(const LambHyper& h, SegmentTypes types, absl::Span<const Segment> segments,
                     absl::Span<float* const> updates, const CpuExec& exec) {
  ZERO_RETURN_IF_ERROR(CheckExec(exec));
  ZERO_RETURN_IF_ERROR(NoSquaresInStep("LambUpdateCpu", h.common));
  ZERO_RETURN_IF_ERROR(CheckLambUpdate("LambUpdateCpu", h, types, segments, updates));
  if (Skipped(h.common)) return absl::OkStatus();
  ZERO_ISA_DISPATCH(exec.isa, LambUpdateLoop, MakeLambCoeffs(WithHostGradScale(h)), types, segments.data(), updates.data(),
                    static_cast<int64_t>(segments.size()), exec.threads);
  return absl::OkStatus();
}

Status LambApplyCpu(const LambHyper& h, DType param_type, absl::Span<const Segment> segments,
                    absl::Span<const float* const> updates, absl::Span<const float> trust_ratios,
                    const CpuExec& exec) {
  ZERO_RETURN_IF_ERROR(CheckExec(exec));
  ZERO_RETURN_IF_ERROR(NoSquaresInStep("LambApplyCpu", h.common));
  ZERO_RETURN_IF_ERROR(CheckLambApply("LambApplyCpu", h, param_type, segments, updates, trust_ratios));
  if (Skipped(h.common)) return absl::OkStatus();
  ZERO_ISA_DISPATCH(exec.isa, LambApplyLoop, h.lr, trust_ratios.data(), param_type,
                    segments.data(), updates.data(), static_cast<int64_t>(segments.size()),
                    exec.threads);
  return absl::OkStatus();
}

float LambTrustRatio(double weight_sq_norm, double update_sq_norm) {
  if (weight_sq_norm <= 0.0 || update_sq_norm <= 0.0) return 1.0f;
  return static_cast<float>(std::sqrt(weight_sq_norm) / std::sqrt(update_sq_norm));
}

}  // namespace zero::kernels
