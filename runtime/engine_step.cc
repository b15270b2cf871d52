// Step(): overflow check and global norm, loss scaling, clipping, the fused optimizer step on
// the rank's owned ranges, then the params store brings every rank's view up to date;
// LastGradNorm(), the norm a step left on the device; and ClipGradNorm(), the norm before the
// step with the clip that step applies.
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {

StatusOr<StepInfo> EngineImpl::Step() {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("Step"));
  ZERO_RETURN_IF_ERROR(RequireFinishableIteration("Step"));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "Step"));
  if (micro_batch_ != config_.gradient_accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Step: ", micro_batch_, " of ", config_.gradient_accumulation_steps,
        " micro-batches are done (gradient_accumulation_steps); finish them with "
        "BeginIteration … EndBackward first"));
  }
  ZERO_RETURN_IF_ERROR(CheckGroupsAgree());
  // The global norm: the sum of squares of the rank's shard, summed over ranks (an Inf/NaN
  // anywhere makes the sum non-finite everywhere), and the clip decision, all on the engine's
  // device, where the optimizer kernels read the gradient scale. Where nothing waits for the
  // norm (no clipping, no loss scaler that skips on overflow, no read by the host before Step
  // returns) and the kernels can, the optimizer kernels sum the squares as they read the
  // gradients (OptimizerState::Step), and the norm is decided after the step instead of
  // costing a read of its own before it.
  last_grad_norm_.reset();  // until this step's norm is decided
  grad_norm_on_device_ = false;
  float* scalars = step_scalars_.as<float>();
  ZERO_RETURN_IF_ERROR(grads_->ZeroUnreduced());
  const double divisor = static_cast<double>(comm_.size()) * loss_scaler_.scale();
  const std::optional<DecidedClip> decided = step_clip_;
  const float clip = config_.clip_grad_norm;  // unless ClipGradNorm decided this step's
  const bool norm_after_step = !decided && clip <= 0.0f && !ReadsNormOnHost() && optimizer_->squares_in_step();
  StepInfo info;
  bool overflow = false;
  if (decided) {  // ClipGradNorm summed these gradients and left the scale in step_scalars_
    last_grad_norm_ = info.grad_norm = decided->grad_norm;
    overflow = decided->overflow;
  } else if (!norm_after_step) {
    ZERO_RETURN_IF_ERROR(optimizer_->GradSquaredNorm(scalars + kSqNorm));
    ZERO_ASSIGN_OR_RETURN(overflow, DecideGradNorm(divisor, clip, &info));
  }
  step_clip_.reset();  // this step's alone: a failure from here on is not retried
  // The step counts as taken from the moment it starts changing params or gradients: a local
  // failure before leaves the engine as it was, and one after refuses a retry that would apply
  // the same gradients twice (a failed collective breaks the group either way; see engine.h).
  if (overflow && loss_scaler_.skips_on_overflow()) {
    const bool at_minimum = loss_scaler_.OverflowWouldGoBelowMinimum();
    micro_batch_ = 0;
    guard_->EndStep();
    loss_scaler_.Update(true);
    ZERO_RETURN_IF_ERROR(params_->AfterStep(/*updated=*/false));
    ZERO_RETURN_IF_ERROR(grads_->Zero());
    info.step = step_;
    info.skipped = true;
    info.loss_scale = loss_scaler_.scale();
    ZERO_LOG(logger_, kInfo) << "step skipped: Inf/NaN gradient; loss scale now " << info.loss_scale;
    if (at_minimum) {  // the skip is done: a trainer that catches this may go on skipping
      return absl::AbortedError(absl::StrCat(
          "Step: the gradient overflows (Inf/NaN) with the loss scale already at its minimum, "
          "loss_scale.min = ", Shortest(config_.loss_scale.min), ": the run has diverged, and DeepSpeed ends it here "
          "(\"Current loss scale already at minimum\"). This step was skipped, as the ones before. Lower the lr, "
          "look for a bad batch, or resume from an earlier checkpoint; a lower loss_scale.min (fp16.min_loss_scale) "
          "only postpones this"));
    }
    return info;
  }
  // guard.on_unused = "zero": a param no rank used since the last step is left untouched.
  std::vector<std::pair<int, std::vector<OptimizerState::OwnedPart>>> untouched;
  if (config_.guard.on_unused == UnusedPolicy::kZero) {
    std::vector<float> used(specs_.size());
    for (size_t p = 0; p < specs_.size(); ++p) used[p] = guard_->UsedThisStep(static_cast<int>(p)) ? 1.0f : 0.0f;
    ZERO_RETURN_IF_ERROR(host_.AllReduce(used.data(), static_cast<int64_t>(used.size()), comm::ReduceOp::kMax));
    for (size_t p = 0; p < specs_.size(); ++p) {
      if (specs_[p].requires_grad && used[p] == 0.0f) {
        ZERO_ASSIGN_OR_RETURN(std::vector<OptimizerState::OwnedPart> parts, optimizer_->ReadOwned(static_cast<int>(p)));
        untouched.emplace_back(static_cast<int>(p), std::move(parts));
      }
    }
  }
  micro_batch_ = 0;
  ++step_;
  guard_->EndStep();
  loss_scaler_.Update(false);
  // Each param counts the steps that updated it, for bias correction (as PyTorch's optimizers
  // keep a step per param): one that no rank used keeps its count. SGD counts only the steps
  // that update its momentum buffer: the first of them starts the buffer from the gradient,
  // as PyTorch's creates it at the first step with momentum, also when that comes late.
  const bool sgd = config_.optimizer.type == OptimizerType::kSgd;
  size_t next_untouched = 0;
  for (size_t p = 0; p < specs_.size(); ++p) {
    if (next_untouched < untouched.size() && untouched[next_untouched].first == static_cast<int>(p)) {
      ++next_untouched;
    } else if (specs_[p].requires_grad && (!sgd || groups_[specs_[p].group].momentum != 0.0f)) {
      ++param_steps_[p];
    }
  }
  kernels::StepCommon common;
  if (norm_after_step) {
    common.grad_scale = static_cast<float>(1.0 / divisor);  // DecideClip's scale without clipping
  } else {
    common.grad_scale_at = scalars + kGradScale;
  }
  ZERO_RETURN_IF_ERROR(optimizer_->Step(groups_, param_steps_, common, norm_after_step ? scalars + kSqNorm : nullptr));
  ApplySchedule();  // the lr of the next step (the schedule advanced with step_)
  for (const auto& [param, parts] : untouched) ZERO_RETURN_IF_ERROR(optimizer_->WriteOwned(param, parts));
  ZERO_RETURN_IF_ERROR(params_->AfterStep(/*updated=*/true));
  ZERO_RETURN_IF_ERROR(grads_->Zero());
  if (norm_after_step) ZERO_RETURN_IF_ERROR(DecideGradNorm(divisor, clip, &info).status());
  ZERO_RETURN_IF_ERROR(CheckReplicasAgree());
  info.step = step_;
  info.loss_scale = loss_scaler_.scale();
  return info;
}

Status EngineImpl::DropGradients() {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("DropGradients"));
  ZERO_RETURN_IF_ERROR(RequireFinishableIteration("DropGradients"));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "DropGradients"));
  if (micro_batch_ == 0) return absl::OkStatus();
  // As a step skipped on overflow, but for the loss scaler and the step count.
  micro_batch_ = 0;
  step_clip_.reset();
  guard_->EndStep();
  ZERO_RETURN_IF_ERROR(params_->AfterStep(/*updated=*/false));
  ZERO_LOG(logger_, kInfo) << "gradients dropped: the next micro-batch starts step " << step_ + 1;
  return grads_->Zero();
}

bool EngineImpl::ReadsNormOnHost() const {
  // Only where it needs them: the loss scaler's overflow flag, or StepInfo::grad_norm under
  // sync_grad_norm (free where the ops are synchronous).
  return !ops_->asynchronous() || config_.sync_grad_norm || loss_scaler_.skips_on_overflow();
}

Status EngineImpl::SumSquaresOverRanks(const char* what) {
  if (comm_.size() == 1) return absl::OkStatus();
  float* squares = step_scalars_.as<float>() + kSqNorm;
  comm::WorkPtr sum = path_.Start([&](comm::Communicator& c) {
    return c.AllReduce(squares, squares, 1, DType::kFP32, comm::ReduceOp::kSum, comm::kHostValuesTag);
  });
  return path_.WaitOnStream(sum, [what] { return absl::StrCat(what, ": the global gradient norm"); });
}

StatusOr<bool> EngineImpl::DecideGradNorm(double divisor, float clip, StepInfo* info) {
  float* scalars = step_scalars_.as<float>();
  ZERO_RETURN_IF_ERROR(SumSquaresOverRanks("Step"));
  ZERO_RETURN_IF_ERROR(ops_->DecideClip(scalars + kSqNorm, divisor, clip, scalars + kGradNorm, scalars + kGradScale));
  grad_norm_on_device_ = !ReadsNormOnHost();
  if (grad_norm_on_device_) {
    info->grad_norm = std::numeric_limits<float>::quiet_NaN();
    return false;
  }
  float host[kStepScalars];
  ZERO_RETURN_IF_ERROR(ops_->Copy(host, scalars, sizeof host));
  ZERO_RETURN_IF_ERROR(RequireCompletedSum("Step"));
  last_grad_norm_ = host[kGradNorm];
  info->grad_norm = host[kGradNorm];
  return !std::isfinite(host[kSqNorm]);
}

Status EngineImpl::RequireCompletedSum(const char* call) {
  // A sum the host waited for completed (or its error was returned then): its value holds
  // even when a peer that went on has broken the group since, as the peer's step holds. One
  // the stream may have waited for may have failed since (the watchdog aborted it, and its
  // error may have gone to a later call): then only a working group vouches for the values.
  if (path_.waits_on_stream()) return RequireHealthyGroup(call);
  return absl::OkStatus();
}

StatusOr<float> EngineImpl::ClipGradNorm(float max_norm) {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("ClipGradNorm"));
  ZERO_RETURN_IF_ERROR(RequireFinishableIteration("ClipGradNorm"));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "ClipGradNorm"));
  if (micro_batch_ != config_.gradient_accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ClipGradNorm: the gradient exists between the step's last EndBackward and Step; ", micro_batch_, " of ",
        config_.gradient_accumulation_steps, " micro-batches (gradient_accumulation_steps) are done"));
  }
  // Every rank learns whether any rank's max_norm is unusable, and the largest and smallest
  // of them (a max over [v, -v]), before any rank refuses: a refusal on one rank alone would
  // leave its peers in the norm's collective.
  const bool valid = max_norm >= 0.0f && !std::isnan(max_norm);
  const float clip = std::isinf(max_norm) ? 0.0f : max_norm;  // +inf: no clipping, as torch's
  float bounds[3] = {valid ? clip : 0.0f, valid ? -clip : 0.0f, valid ? 0.0f : 1.0f};
  if (comm_.size() > 1) {
    Status agreed = host_.AllReduce(bounds, 3, comm::ReduceOp::kMax);
    if (!agreed.ok()) return Status(agreed.code(), absl::StrCat("ClipGradNorm: ", agreed.message()));
  }
  if (bounds[2] > 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClipGradNorm: max_norm must be a number >= 0 (0 or +inf: no clipping) on every rank; it is ",
        Shortest(max_norm), valid ? " here and unusable on another rank" : " on this rank",
        ". Nothing changed; call it again with one usable value"));
  }
  if (bounds[0] != -bounds[1]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClipGradNorm: the ranks clip to different norms: max_norm is ", Shortest(-bounds[1]), " on one rank and ",
        Shortest(bounds[0]), " on another (", Shortest(max_norm), " on this rank); every rank must pass the same "
        "value, or their shards would be scaled differently. Nothing changed; call it again with one value."));
  }
  // The last step's norm may still be on the device only, in the scalar this call reuses.
  if (grad_norm_on_device_ && !last_grad_norm_.has_value()) ZERO_RETURN_IF_ERROR(LastGradNorm().status());
  ZERO_RETURN_IF_ERROR(grads_->ZeroUnreduced());
  float* scalars = step_scalars_.as<float>();
  ZERO_RETURN_IF_ERROR(optimizer_->GradSquaredNorm(scalars + kSqNorm));
  ZERO_RETURN_IF_ERROR(SumSquaresOverRanks("ClipGradNorm"));
  const double divisor = static_cast<double>(comm_.size()) * loss_scaler_.scale();
  ZERO_RETURN_IF_ERROR(
      ops_->DecideClip(scalars + kSqNorm, divisor, clip, scalars + kGradNorm, scalars + kGradScale));
  float host[kStepScalars];
  ZERO_RETURN_IF_ERROR(ops_->Copy(host, scalars, sizeof host));
  ZERO_RETURN_IF_ERROR(RequireCompletedSum("ClipGradNorm"));
  step_clip_ = DecidedClip{host[kGradNorm], !std::isfinite(host[kSqNorm])};
  return host[kGradNorm];
}

StatusOr<float> EngineImpl::LastGradNorm() {
  if (!last_grad_norm_.has_value() && !grad_norm_on_device_) {
    return absl::FailedPreconditionError(
        "LastGradNorm: there is no norm to read: no Step has run yet, or the last one failed before its norm");
  }
  if (!last_grad_norm_.has_value()) {
    float norm = 0.0f;
    ZERO_RETURN_IF_ERROR(ops_->Copy(&norm, step_scalars_.as<float>() + kGradNorm, sizeof norm));
    ZERO_RETURN_IF_ERROR(RequireCompletedSum("LastGradNorm"));
    last_grad_norm_ = norm;
  }
  return *last_grad_norm_;
}

}  // namespace zero::runtime
