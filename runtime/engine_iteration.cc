// The micro-batch protocol: BeginIteration, gradient arrival, EndBackward.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/reduce.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {

Status EngineImpl::BeginIteration() {
  if (phase_ == Phase::kBackward) {
    std::vector<std::string> waiting;
    for (size_t b = 0; b < pending_.size(); ++b) {
      if (pending_[b] == 0) continue;
      std::vector<std::string> missing;
      for (int p : plan_->buckets()[b].params) {
        if (arrival_[p] < 0 && missing.size() < 8) missing.push_back(ParamLabel(p));
      }
      waiting.push_back(absl::StrCat("bucket ", b, " (still waiting for ", absl::StrJoin(missing, ", "),
                                     pending_[b] > 8 ? ", …" : "", ")"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginIteration: iteration ", iteration_, " has not finished — EndBackward() was not "
        "called. Pending reductions: ", waiting.empty() ? "none (all buckets were ready)" : absl::StrJoin(waiting, "; "),
        ". Call EndBackward() after every backward pass, also after skipping one."));
  }
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "BeginIteration"));
  if (micro_batch_ == config_.gradient_accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginIteration: ", micro_batch_, " micro-batches are done (gradient_accumulation_steps = ",
        config_.gradient_accumulation_steps, "); call Step() first"));
  }
  std::fill(arrival_.begin(), arrival_.end(), -1);
  arrivals_ = 0;
  ZERO_RETURN_IF_ERROR(scheduler_->Reset());
  for (const partition::Bucket& b : plan_->buckets()) {
    pending_[b.index] = b.trainable ? static_cast<int>(b.params.size()) : 0;
  }
  ++iteration_;
  phase_ = Phase::kBackward;
  for (const partition::Bucket& b : plan_->buckets()) {  // frozen buckets have nothing to send
    if (!b.trainable) ZERO_RETURN_IF_ERROR(scheduler_->MarkReady(b.index, nullptr, nullptr));
  }
  return absl::OkStatus();
}

StatusOr<void*> EngineImpl::GradBuffer(ParamId id) {
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kBackward, "GradBuffer"));
  ZERO_RETURN_IF_ERROR(CheckParamId(id, "GradBuffer"));
  const int param = static_cast<int>(id);
  if (!specs_[param].requires_grad) {
    return absl::FailedPreconditionError(absl::StrCat("GradBuffer: param ", ParamLabel(param),
                                                      " is frozen (requires_grad = false)"));
  }
  if (arrival_[param] >= 0) {
    return DuplicateGradientError(absl::StrCat(
        "GradBuffer: param ", ParamLabel(param), " was already marked ready in iteration ", iteration_,
        " (arrival #", arrival_[param], "); its gradient may already be on the wire. Add every "
        "contribution before calling GradReady, or set guard.on_duplicate = \"count\""));
  }
  return grads_->View(param);
}

Status EngineImpl::GradReady(ParamId id) {
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kBackward, "GradReady"));
  ZERO_RETURN_IF_ERROR(CheckParamId(id, "GradReady"));
  const int param = static_cast<int>(id);
  if (!specs_[param].requires_grad) {
    return absl::FailedPreconditionError(absl::StrCat("GradReady: param ", ParamLabel(param),
                                                      " is frozen (requires_grad = false)"));
  }
  const int bucket = plan_->placement(param).bucket;
  if (arrival_[param] >= 0) {
    const bool reduced = scheduler_->next_to_launch() > bucket;
    return DuplicateGradientError(absl::StrCat(
        "param ", ParamLabel(param), " received a second gradient in iteration ", iteration_,
        " (arrivals #", arrival_[param], " and #", arrivals_, " of this iteration); its bucket ", bucket,
        reduced ? " had already been reduced" : " was still waiting for other params",
        ". The first gradient is intact. Likely causes: reentrant activation checkpointing "
        "(use_reentrant=True) runs backward through this param twice — use non-reentrant "
        "checkpointing; or the weight is used twice (tied embeddings, a module called twice) — add "
        "both contributions before calling GradReady, or set guard.on_duplicate = \"count\""));
  }
  arrival_[param] = arrivals_++;
  ZERO_LOG(logger_, kDetail) << "iteration " << iteration_ << ": " << ParamLabel(param)
                             << " ready (arrival #" << arrival_[param] << ", bucket " << bucket << ")";
  if (--pending_[bucket] == 0 && config_.buckets.overlap) return BucketReady(bucket);
  return absl::OkStatus();
}

Status EngineImpl::AccumulateGrad(ParamId id, const void* grad) {
  if (grad == nullptr) return absl::InvalidArgumentError("AccumulateGrad: grad is null");
  ZERO_ASSIGN_OR_RETURN(void* view, GradBuffer(id));
  const int param = static_cast<int>(id);
  const void* inputs[2] = {view, grad};
  comm::ReduceInto(view, inputs, 2, plan_->placement(param).numel, specs_[param].dtype, comm::ReduceOp::kSum);
  return GradReady(id);
}

Status EngineImpl::BucketReady(int bucket) {
  const bool reduce = config_.stage == 2 || LastMicroBatch();
  ZERO_ASSIGN_OR_RETURN(auto reduction, grads_->Reduction(bucket, reduce));
  return scheduler_->MarkReady(bucket, std::move(reduction.first), std::move(reduction.second));
}

Status EngineImpl::EndBackward() {
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kBackward, "EndBackward"));
  std::vector<std::string> unused;
  int unused_count = 0;
  for (size_t p = 0; p < specs_.size(); ++p) {
    if (!specs_[p].requires_grad || arrival_[p] >= 0) continue;
    if (++unused_count <= 20) unused.push_back(ParamLabel(static_cast<int>(p)));
  }
  if (unused_count > 0) {
    return UnusedParametersError(absl::StrCat(
        "rank ", comm_.rank(), ": ", unused_count, " param(s) got no gradient in iteration ", iteration_,
        ": ", absl::StrJoin(unused, ", "), unused_count > 20 ? ", …" : "",
        ". Call GradReady for them (with a zero gradient if the branch was skipped), mark them "
        "requires_grad = false if they are never trained, or set guard.on_unused = \"zero\""));
  }
  phase_ = Phase::kIdle;  // launches from here on count as after EndBackward
  if (!config_.buckets.overlap) {
    for (const partition::Bucket& b : plan_->buckets()) {
      if (b.trainable) ZERO_RETURN_IF_ERROR(BucketReady(b.index));
    }
  }
  Status waited = scheduler_->WaitAll(config_.guard.timeout_s);
  if (!waited.ok()) {
    return Status(waited.code(), absl::StrCat("EndBackward (iteration ", iteration_, "): ", waited.message()));
  }
  ++micro_batch_;
  return absl::OkStatus();
}

}  // namespace zero::runtime
