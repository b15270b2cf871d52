// The micro-batch protocol: BeginIteration, gradient arrival (through the guard), EndBackward.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {

Status EngineImpl::BeginIteration() {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("BeginIteration"));
  ZERO_RETURN_IF_ERROR(RequireFinishableIteration("BeginIteration"));
  if (phase_ == Phase::kBackward) {
    std::vector<std::string> waiting;
    for (size_t b = 0; b < pending_.size(); ++b) {
      if (pending_[b] == 0) continue;
      std::vector<std::string> missing;
      for (int p : plan_->buckets()[b].params) {
        if (guard_->arrival(p) < 0 && missing.size() < 8) missing.push_back(ParamLabel(p));
      }
      waiting.push_back(absl::StrCat("bucket ", b, " (still waiting for ", absl::StrJoin(missing, ", "),
                                     pending_[b] > 8 ? ", …" : "", ")"));
    }
    const bool refused = !refused_end_backward_.empty();
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginIteration: iteration ", iteration_, " has not finished — ",
        refused ? absl::StrCat("its EndBackward() was refused (", refused_end_backward_, ")")
                : "EndBackward() was not called",
        ". Pending reductions: ", waiting.empty() ? "none (all buckets were ready)" : absl::StrJoin(waiting, "; "),
        refused ? ". Give the missing gradients (or mark them absent) and call EndBackward() again, or "
                  "AbandonMicroBatch() to drop the micro-batch."
                : ". Call EndBackward() after every backward pass, also after skipping one."));
  }
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "BeginIteration"));
  if (micro_batch_ == config_.gradient_accumulation_steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginIteration: ", micro_batch_, " micro-batches are done (gradient_accumulation_steps = ",
        config_.gradient_accumulation_steps, "); call Step() first"));
  }
  ZERO_RETURN_IF_ERROR(SyncReplicasOnce());
  ZERO_RETURN_IF_ERROR(scheduler_->Reset());
  ++iteration_;
  refused_end_backward_.clear();  // a dropped micro-batch's refusal is no longer this one's
  guard_->BeginMicroBatch(iteration_);
  for (const partition::Bucket& b : plan_->buckets()) {
    pending_[b.index] = b.trainable ? static_cast<int>(b.params.size()) : 0;
    handed_[b.index] = 0;
  }
  phase_ = Phase::kBackward;
  for (const partition::Bucket& b : plan_->buckets()) {  // frozen buckets have nothing to send
    if (!b.trainable) {
      handed_[b.index] = 1;
      ZERO_RETURN_IF_ERROR(scheduler_->MarkReady(b.index, nullptr, nullptr));
    }
  }
  return absl::OkStatus();
}

Status EngineImpl::CheckGradientCall(ParamId id, const char* call) const {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup(call));
  ZERO_RETURN_IF_ERROR(RequireFinishableIteration(call));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kBackward, call));
  ZERO_RETURN_IF_ERROR(CheckParamId(id, call));
  if (specs_[id].requires_grad) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(call, ": param ", ParamLabel(static_cast<int>(id)),
                                                    " is frozen (requires_grad = false)"));
}

StatusOr<void*> EngineImpl::GradBuffer(ParamId id) {
  ZERO_RETURN_IF_ERROR(PrepareGradWrite(id, "GradBuffer"));
  return grads_->View(static_cast<int>(id));
}

Status EngineImpl::PrepareGradWrite(ParamId id, const char* call, bool lend) {
  ZERO_RETURN_IF_ERROR(CheckGradientCall(id, call));
  const int param = static_cast<int>(id);
  const int bucket = plan_->placement(param).bucket;
  ZERO_RETURN_IF_ERROR(guard_->CheckWritable(param, handed_[bucket] != 0));
  if (lend && grads_->LendsWithoutBuffer(param, specs_[param].dtype, LastMicroBatch())) return absl::OkStatus();
  return WaitForGradBuffer(bucket, param);
}

Status EngineImpl::WaitForGradBuffer(int bucket, int arriving) {
  while (grads_->NeedsBufferWait(bucket)) {
    // Nothing in flight to free a buffer, and buckets launch in a fixed order: the bucket
    // waiting can never have one unless the pool grows.
    if (scheduler_->in_flight() == 0) {
      ZERO_RETURN_IF_ERROR(GrowGradBufferPool(arriving));
      continue;
    }
    ZERO_RETURN_IF_ERROR(scheduler_->WaitOldest(config_.guard.timeout_s));  // its Finish frees a buffer
    ++counters_.pool_waits;
  }
  return absl::OkStatus();
}

Status EngineImpl::GrowGradBufferPool(int arriving) {
  const int buffers = grads_->pool_buffers();
  const std::string held = absl::StrCat("all ", buffers, " gradient bucket buffers are held by buckets still being "
                                        "filled or waiting to launch, and no reduction in flight will free one. ");
  if (!config_.buckets.grow_pool) {
    return LoseIteration(absl::ResourceExhaustedError(absl::StrCat(
        "gradient buffers exhausted (buckets.grow_pool = false): ", held, PoolShortfall(arriving),
        " raise buckets.pool_buffers or buckets.reduce_bucket_elems, or set buckets.grow_pool = true")));
  }
  if (Status added = grads_->AddPoolBuffer(); !added.ok()) {
    return LoseIteration(absl::ResourceExhaustedError(absl::StrCat(
        "gradient buffers exhausted: ", held, "Adding one failed: ", added.message(), ". ", PoolShortfall(arriving),
        " raise buckets.reduce_bucket_elems (fewer, larger buckets) or give the job more memory")));
  }
  ++counters_.pool_buffers_added;
  if (counters_.pool_buffers_added > 1) {
    ZERO_LOG(logger_, kDetail) << "iteration " << iteration_ << ": added a gradient bucket buffer (now "
                               << buffers + 1 << ")";
    return absl::OkStatus();
  }
  ZERO_LOG(logger_, kWarn) << "iteration " << iteration_ << ": " << held << "Added one (now " << buffers + 1
                           << "; buckets.pool_buffers = " << config_.buckets.pool_buffers
                           << "), kept for later steps. " << PoolShortfall(arriving)
                           << " raise buckets.pool_buffers or buckets.reduce_bucket_elems to stop the pool growing "
                              "(up to one buffer per bucket); buckets.grow_pool = false makes this an error. Later "
                              "additions are counted (pool_buffers_added), not logged.";
  return absl::OkStatus();
}

std::string EngineImpl::PoolShortfall(int arriving) const {
  const int blocking = scheduler_->next_to_launch();
  std::vector<std::string> missing;  // the blocking bucket's params that have had no gradient
  if (blocking < static_cast<int>(plan_->buckets().size())) {
    for (int param : plan_->buckets()[blocking].params) {
      if (param != arriving && !guard_->complete(param) && guard_->arrival(param) < 0) {
        missing.push_back(ParamLabel(param));
      }
    }
  }
  if (missing.empty()) return "Gradients are arriving far from backward order:";
  const bool marks_unused = config_.guard.on_unused == UnusedPolicy::kZero;
  // Under guard.on_unused = "zero", a param that gets no gradient holds its bucket until
  // EndBackward unless the trainer says so as soon as it knows.
  const char* declare_absent =
      marks_unused ? " A param that gets no gradient in this micro-batch holds its bucket back until EndBackward "
                     "unless the trainer declares it with GradAbsent(id) as soon as it knows (zerort.torch does so "
                     "where the autograd graph tells: not behind a custom autograd.Function such as reentrant "
                     "checkpointing)."
                   : "";
  const size_t shown = std::min<size_t>(missing.size(), 4);
  return absl::StrCat(
      "Buckets launch in one fixed order on every rank, and bucket ", blocking,
      ", next in it, still waits for params that have had no gradient in this backward: ",
      absl::StrJoin(missing.begin(), missing.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
      missing.size() > shown ? absl::StrCat(" and ", missing.size() - shown, " more") : "", ".", declare_absent,
      marks_unused ? " If"
                   : " If the forward does not use them (a module or branch left out), set guard.on_unused = "
                     "\"zero\" (DeepSpeed: zero_optimization.ignore_unused_parameters = true), or freeze them "
                     "before initialize; if",
      " their gradients come later in this backward,");
}

Status EngineImpl::GradReady(ParamId id) {
  ZERO_RETURN_IF_ERROR(CheckGradientCall(id, "GradReady"));
  const int param = static_cast<int>(id);
  const int bucket = plan_->placement(param).bucket;
  bool complete = false;
  ZERO_RETURN_IF_ERROR(guard_->Arrive(param, handed_[bucket] != 0, &complete));
  if (iteration_ <= kDetailedIterations) {
    ZERO_LOG(logger_, kDetail) << "iteration " << iteration_ << ": " << ParamLabel(param) << " arrived (#"
                               << guard_->arrival(param) << ", bucket " << bucket
                               << (complete ? ", complete)" : ", more expected)");
  }
  return complete ? ParamComplete(param) : absl::OkStatus();
}

Status EngineImpl::GradAbsent(ParamId id) {
  ZERO_RETURN_IF_ERROR(CheckGradientCall(id, "GradAbsent"));
  const int param = static_cast<int>(id);
  bool complete = false;
  ZERO_RETURN_IF_ERROR(guard_->Absent(param, &complete));
  return complete ? ParamComplete(param) : absl::OkStatus();
}

Status EngineImpl::ParamComplete(int param) {
  const int bucket = plan_->placement(param).bucket;
  if (--pending_[bucket] > 0 || !config_.buckets.overlap || phase_ != Phase::kBackward) return absl::OkStatus();
  handed_[bucket] = 1;
  return BucketReady(bucket);
}

Status EngineImpl::AccumulateGrad(ParamId id, const void* grad) {
  const bool on_gpu = ops_->placement() == Placement::kDevice;
  return AccumulateGrad(id, grad, on_gpu ? PlacementOf(grad) : Placement::kHost);
}

Status EngineImpl::AccumulateGrad(ParamId id, const void* grad, Placement placement) {
  return HandOverGrad(id, grad, placement, /*lend=*/false, "AccumulateGrad").status();
}

StatusOr<bool> EngineImpl::LendGrad(ParamId id, const void* grad, Placement placement) {
  return HandOverGrad(id, grad, placement, /*lend=*/true, "LendGrad");
}

StatusOr<bool> EngineImpl::HandOverGrad(ParamId id, const void* grad, Placement placement, bool lend,
                                        const char* call) {
  if (grad == nullptr) return absl::InvalidArgumentError(absl::StrCat(call, ": grad is null"));
  if (placement == Placement::kDevice && ops_->placement() != Placement::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, ": a device gradient for param ", id, " on an engine of device \"",
        DeviceName(config_.device), "\"; hand it over in host memory"));
  }
  const int param = static_cast<int>(id);
  // Kept where it is only in the engine's own memory (a host gradient for a GPU engine is staged).
  const bool lendable = lend && (placement == Placement::kDevice) == (ops_->placement() == Placement::kDevice);
  ZERO_RETURN_IF_ERROR(PrepareGradWrite(id, call, lendable));
  if (lendable) {
    ZERO_ASSIGN_OR_RETURN(const bool kept, grads_->Lend(param, grad, specs_[param].dtype, LastMicroBatch()));
    if (kept) {
      const Status ready = GradReady(id);
      if (!ready.ok()) {
        grads_->TakeBack(param).IgnoreError();  // the caller keeps nothing for a failed call
        return ready;
      }
      return true;
    }
  }
  if (ops_->placement() == Placement::kDevice && placement != Placement::kDevice) {
    // A host gradient for a GPU engine: staged into device scratch first.
    const int64_t bytes = plan_->ParamBytes(param);
    if (grad_staging_.bytes() < bytes) {
      grad_staging_.Reset();
      ZERO_ASSIGN_OR_RETURN(grad_staging_, allocator_.Allocate(bytes, MemoryCategory::kWorkspace, Placement::kDevice));
    }
    ZERO_RETURN_IF_ERROR(ops_->Copy(grad_staging_.data(), grad, bytes));
    grad = grad_staging_.data();
  }
  // `grad` is in the param's dtype; the gradient it goes into may be fp32 (Bucket::grad_dtype).
  ZERO_RETURN_IF_ERROR(grads_->Accumulate(param, grad, specs_[param].dtype));
  counters_.grad_bytes_copied += plan_->ParamBytes(param);
  ZERO_RETURN_IF_ERROR(GradReady(id));
  return false;
}

Status EngineImpl::BucketReady(int bucket) {
  if (!grads_->ReducesWithoutBuffer(bucket)) {
    ZERO_RETURN_IF_ERROR(WaitForGradBuffer(bucket));  // also for a bucket nobody wrote (reduced as zeros)
  }
  ZERO_ASSIGN_OR_RETURN(auto reduction, grads_->Reduction(bucket, LastMicroBatch()));
  return scheduler_->MarkReady(bucket, std::move(reduction.first), std::move(reduction.second));
}

Status EngineImpl::EndBackward() {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("EndBackward"));
  ZERO_RETURN_IF_ERROR(RequireFinishableIteration("EndBackward"));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kBackward, "EndBackward"));
  return FinishBackward(/*abandon=*/false);
}

Status EngineImpl::AbandonMicroBatch() {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("AbandonMicroBatch"));
  ZERO_RETURN_IF_ERROR(RequireFinishableIteration("AbandonMicroBatch"));
  if (phase_ == Phase::kBackward) {
    ZERO_RETURN_IF_ERROR(FinishBackward(/*abandon=*/true));
    ZERO_LOG(logger_, kInfo) << "iteration " << iteration_ << " abandoned: its missing gradients counted as zeros";
  }
  return DropGradients();
}

Status EngineImpl::FinishBackward(bool abandon) {
  std::vector<int> to_complete;
  if (Status guarded = guard_->AtEndBackward(comm_.rank(), &to_complete, abandon); !guarded.ok()) {
    const absl::string_view message = guarded.message();
    refused_end_backward_ = std::string(message.substr(0, std::min<size_t>(message.find('\n'), 200)));
    return guarded;
  }
  refused_end_backward_.clear();
  phase_ = Phase::kIdle;  // launches from here on count as after EndBackward
  // From here a failure leaves the micro-batch half reduced: no iteration can follow.
  for (int param : to_complete) --pending_[plan_->placement(param).bucket];
  for (const partition::Bucket& b : plan_->buckets()) {
    if (handed_[b.index] || pending_[b.index] > 0) continue;
    handed_[b.index] = 1;
    if (Status ready = BucketReady(b.index); !ready.ok()) return LoseIteration(ready);
  }
  Status waited = scheduler_->WaitAll(config_.guard.timeout_s);
  if (!waited.ok()) {
    return LoseIteration(
        Status(waited.code(), absl::StrCat("EndBackward (iteration ", iteration_, "): ", waited.message())));
  }
  params_->EndOfMicroBatch();
  ++micro_batch_;
  return absl::OkStatus();
}

}  // namespace zero::runtime
