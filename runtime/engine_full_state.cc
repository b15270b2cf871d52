// GetFullState() / SetFullState(): a trainable param's full fp32 master weights, optimizer
// moments or reduced gradient, assembled from the parts each rank steps, and set back into
// them (DeepSpeed's safe_get_full_* and safe_set_full_* calls).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/elementwise.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {

StatusOr<int> EngineImpl::CheckFullStateCall(ParamId id, ParamState state, const void* buffer,
                                             const char* call) const {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup(call));
  ZERO_RETURN_IF_ERROR(CheckParamId(id, call));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, call));
  if (buffer == nullptr) return absl::InvalidArgumentError(absl::StrCat(call, ": the values' buffer is null"));
  if (state != ParamState::kWeights && state != ParamState::kFirstMoment && state != ParamState::kSecondMoment &&
      state != ParamState::kGrad) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, ": state ", static_cast<int>(state), " is not a ParamState (0 weights, 1 and 2 the moments, 3 the gradient)"));
  }
  const int param = static_cast<int>(id);
  if (!specs_[param].requires_grad) {
    return absl::FailedPreconditionError(absl::StrCat(
        call, ": param ", ParamLabel(param),
        " is frozen (requires_grad false): it has no master, moments or gradient; GetParam and SetParam read and "
        "set its values"));
  }
  const int moment = state == ParamState::kFirstMoment ? 1 : state == ParamState::kSecondMoment ? 2 : 0;
  if (moment > optimizer_->state_count()) {
    return absl::NotFoundError(absl::StrCat(call, ": the optimizer keeps ", optimizer_->state_count(),
                                            " moment buffer(s) per param, so there is no moment ", moment, " of ",
                                            ParamLabel(param)));
  }
  return moment;
}

Status EngineImpl::GetFullState(ParamId id, ParamState state, float* out) {
  ZERO_ASSIGN_OR_RETURN(const int moment, CheckFullStateCall(id, state, out, "GetFullState"));
  const int param = static_cast<int>(id);
  if (state == ParamState::kGrad && micro_batch_ != config_.gradient_accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GetFullState: the gradient of ", ParamLabel(param), " exists between the step's last EndBackward and Step; ",
        micro_batch_, " of ", config_.gradient_accumulation_steps, " micro-batches are done"));
  }
  const int64_t numel = plan_->placement(param).numel;
  std::fill(out, out + numel, 0.0f);
  // Each part lands where it belongs; the rest stays zero, so a sum over the ranks (which own
  // disjoint parts from stage 1 on) assembles the whole param exactly.
  std::vector<float> scratch;
  auto place = [&](int64_t begin, int64_t n, const float* values) {
    std::copy(values, values + n, out + begin);
    return absl::OkStatus();
  };
  if (state == ParamState::kGrad) {
    ZERO_RETURN_IF_ERROR(grads_->ZeroUnreduced());
    ZERO_RETURN_IF_ERROR(optimizer_->VisitOwnedGrad(param, &scratch, place));
    const double scale = 1.0 / (static_cast<double>(comm_.size()) * loss_scaler_.scale());
    for (int64_t i = 0; i < numel; ++i) out[i] = static_cast<float>(out[i] * scale);
  } else {
    ZERO_RETURN_IF_ERROR(optimizer_->VisitOwned(param, &scratch, [&](int64_t begin, int64_t n, const float* values) {
      return place(begin, n, values + moment * n);  // weights, then each moment: n floats each
    }));
  }
  if (config_.stage == 0 || comm_.size() == 1) return absl::OkStatus();  // every rank steps it whole
  Status summed = host_.AllReduce(out, numel, comm::ReduceOp::kSum);
  if (!summed.ok()) return Status(summed.code(), absl::StrCat("GetFullState: ", summed.message()));
  return absl::OkStatus();
}

Status EngineImpl::SetFullState(ParamId id, ParamState state, const float* values) {
  ZERO_ASSIGN_OR_RETURN(const int moment, CheckFullStateCall(id, state, values, "SetFullState"));
  const int param = static_cast<int>(id);
  if (state == ParamState::kGrad) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SetFullState: the gradient of ", ParamLabel(param), " is not set: it comes from backward"));
  }
  if (moment == 1 && config_.optimizer.type == OptimizerType::kSgd && param_steps_[param] == 0) {
    // SGD's first step with momentum starts the buffer from the gradient (as PyTorch's,
    // which has no buffer before it): a value set now would be dropped there.
    return absl::FailedPreconditionError(absl::StrCat(
        "SetFullState: SGD's momentum buffer of ", ParamLabel(param),
        " exists from its first optimizer step with momentum on (that step starts it from the gradient); set it after "
        "that step"));
  }
  // Each rank keeps its part of the values: ranks passing different ones would leave parts
  // that fit no single value (moments no later check compares).
  const int64_t numel = plan_->placement(param).numel;
  ZERO_RETURN_IF_ERROR(AgreeOnBytes(values, numel * 4, absl::StrCat("SetFullState of ", ParamLabel(param))));
  if (state == ParamState::kWeights) {
    // The model copy first, as SetParam sets it (rounded to the param's dtype); the exact fp32
    // master of the rank's part after it.
    const DType dtype = specs_[param].dtype;
    std::vector<char> rounded(static_cast<size_t>(numel) * DTypeSize(dtype));
    kernels::NarrowCpu(rounded.data(), values, numel, dtype);
    replicas_synced_ = false;  // the next iteration compares (and repairs) the replicas again
    ZERO_RETURN_IF_ERROR(params_->Set(param, rounded.data()));
  }
  ZERO_ASSIGN_OR_RETURN(std::vector<OptimizerState::OwnedPart> parts, optimizer_->ReadOwned(param));
  for (OptimizerState::OwnedPart& part : parts) {
    std::copy(values + part.begin, values + part.begin + part.numel, part.values.begin() + moment * part.numel);
  }
  return optimizer_->WriteOwned(param, parts);
}

}  // namespace zero::runtime
