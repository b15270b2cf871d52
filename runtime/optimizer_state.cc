// Owned ranges, master copies, moments, and the fused step over them.
#include "runtime/optimizer_state.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/optimizers.h"
#include "kernels/launch_table.h"

namespace zero::runtime {
namespace {

// The kernel arguments Adam, AdamW and LAMB share, from a group's hyperparameters.
template <typename Hyper>
Hyper AdamFamilyHyper(const OptimizerHyper& o, int64_t step, const kernels::StepCommon& common) {
  Hyper h;
  h.lr = o.lr;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.eps = o.eps;
  h.weight_decay = o.weight_decay;
  h.step = step;
  h.common = common;
  return h;
}

// SGD keeps its momentum buffer only where some group starts with momentum; one turned on
// later adds it then (AddMomentumBuffer).
bool NeedsState0(const OptimizerConfig& o) {
  if (o.type != OptimizerType::kSgd || o.momentum != 0.0f) return true;
  for (size_t g = 0; g < o.param_groups.size(); ++g) {
    if (o.Group(static_cast<int>(g)).momentum != 0.0f) return true;
  }
  return false;
}
bool NeedsState1(const OptimizerConfig& o) {
  return o.type == OptimizerType::kAdam || o.type == OptimizerType::kAdamW || o.type == OptimizerType::kLamb;
}

}  // namespace

StatusOr<std::unique_ptr<OptimizerState>> OptimizerState::Create(
    const Config& config, const partition::PartitionPlan& plan, int rank, const OwnedParams& params,
    GradStore& grads, base::Allocator& allocator, DeviceOps& ops, SumOverRanks sum_over_ranks) {
  std::unique_ptr<OptimizerState> s(new OptimizerState(config, plan, grads, ops, allocator));
  s->sum_over_ranks_ = std::move(sum_over_ranks);
  int64_t state_numel = 0, master_numel = 0;
  for (const partition::Bucket& b : plan.buckets()) {
    if (!b.trainable) continue;
    const partition::OwnedSpan owned = plan.Owned(b.index, rank);
    s->ranges_.push_back({b.index, owned.begin, owned.numel, nullptr, state_numel, params(b.index)});
    state_numel += owned.numel;
    if (b.dtype != DType::kFP32) master_numel += owned.numel;
  }
  auto allocate = [&](int64_t floats, base::Buffer* out) -> Status {
    ZERO_ASSIGN_OR_RETURN(*out, allocator.Allocate(floats * 4, MemoryCategory::kOptimizer, ops.placement()));
    return ops.Zero(out->data(), out->bytes());
  };
  ZERO_RETURN_IF_ERROR(allocate(master_numel, &s->master_));
  ZERO_RETURN_IF_ERROR(allocate(NeedsState0(config.optimizer) ? state_numel : 0, &s->state0_));
  ZERO_RETURN_IF_ERROR(allocate(NeedsState1(config.optimizer) ? state_numel : 0, &s->state1_));

  // Segments, grouped by (group, dtype) in bucket order.
  std::map<std::pair<int, int>, size_t> batch_of;
  int64_t state_offset = 0, master_offset = 0;
  for (OwnedRange& r : s->ranges_) {
    const partition::Bucket& b = plan.buckets()[r.bucket];
    char* param_part = r.params;
    kernels::Segment segment;
    if (b.dtype == DType::kFP32) {
      r.master = reinterpret_cast<float*>(param_part);
    } else {
      r.master = s->master_.as<float>() + master_offset;
      master_offset += r.numel;
      segment.model_param = param_part;
    }
    segment.master = r.master;
    segment.grad = grads.OwnedGrad(r.bucket);
    segment.state0 = s->state0_.bytes() > 0 ? s->state0_.as<float>() + state_offset : nullptr;
    segment.state1 = s->state1_.bytes() > 0 ? s->state1_.as<float>() + state_offset : nullptr;
    segment.numel = r.numel;
    state_offset += r.numel;
    // The gradient dtype follows from the param dtype (partition::GradientDType): one per batch.
    auto [it, fresh] = batch_of.emplace(std::make_pair(b.group, static_cast<int>(b.dtype)), s->batches_.size());
    if (fresh) s->batches_.push_back({b.group, {b.dtype, b.grad_dtype}, {}, {}, {}, {}});
    Batch& batch = s->batches_[it->second];
    batch.segments.push_back(segment);
    batch.segment_state_begins.push_back(r.state_begin);
    s->CutPerParam(r, segment, [&](int param, const kernels::Segment& fragment, int64_t at) {
      batch.fragments.push_back({param, fragment, r.begin + at - plan.placement(param).offset, r.state_begin + at});
    });
    // Each rank's norm covers its shard only, also at stage 0 where it owns the whole bucket.
    const int64_t shard_begin = rank * b.shard_numel - r.begin;
    s->batches_[it->second].norm_spans.push_back(
        {static_cast<const char*>(segment.grad) + shard_begin * b.grad_element_bytes(), b.shard_numel});
  }
  if (config.optimizer.type == OptimizerType::kLamb) {
    ZERO_ASSIGN_OR_RETURN(s->lamb_updates_, allocator.Allocate(state_numel * 4, MemoryCategory::kWorkspace, ops.placement()));
  }
  // The step sums the squares of what it reads where the ops can, when what it reads is the
  // rank's shard (not at stage 0 with several ranks, where each rank steps every bucket whole)
  // and the optimizer is not LAMB (which reads the gradients in a pass of its own): room for
  // one partial per block of its largest launch plan (each batch whole or cut per param).
  bool owned_is_shard = true;
  for (const OwnedRange& r : s->ranges_) {
    const partition::Bucket& b = plan.buckets()[r.bucket];
    owned_is_shard = owned_is_shard && r.begin == rank * b.shard_numel && r.numel == b.shard_numel;
  }
  if (ops.squares_in_step() && owned_is_shard && config.optimizer.type != OptimizerType::kLamb) {
    int64_t blocks = 0;
    for (const Batch& batch : s->batches_) {
      int64_t per_param = 0;
      for (const Fragment& f : batch.fragments) per_param += kernels::LaunchBlocks({f.segment});
      blocks += std::max(kernels::LaunchBlocks(batch.segments), per_param);
    }
    ZERO_ASSIGN_OR_RETURN(s->squares_, allocator.Allocate(std::max<int64_t>(blocks, 1) * sizeof(double),
                                                         MemoryCategory::kWorkspace, ops.placement()));
  }
  return s;
}

template <typename Fn>
void OptimizerState::ForOwnedPart(int param, Fn fn) const {
  const auto& place = plan_.placement(param);
  for (const OwnedRange& r : ranges_) {
    if (r.bucket != place.bucket) continue;
    const int64_t begin = std::max(r.begin, place.offset);
    const int64_t end = std::min(r.begin + r.numel, place.offset + place.numel);
    if (begin < end) fn(r, begin, end);
  }
}

Status OptimizerState::RefreshMaster(int param) {
  const partition::Bucket& b = plan_.buckets()[plan_.placement(param).bucket];
  if (b.dtype == DType::kFP32) return absl::OkStatus();  // the params are the master
  const int64_t element = b.element_bytes();
  Status status = absl::OkStatus();
  ForOwnedPart(param, [&](const OwnedRange& r, int64_t begin, int64_t end) {
    const int64_t at = begin - r.begin;
    status.Update(ops_.Widen(r.master + at, r.params + at * element, end - begin, b.dtype));
  });
  return status;
}

Status OptimizerState::RoundModelCopy(int param) {
  const partition::Bucket& b = plan_.buckets()[plan_.placement(param).bucket];
  if (b.dtype == DType::kFP32) return absl::OkStatus();  // the master is the model copy
  const int64_t element = b.element_bytes();
  Status status = absl::OkStatus();
  ForOwnedPart(param, [&](const OwnedRange& r, int64_t begin, int64_t end) {
    const int64_t at = begin - r.begin;
    status.Update(ops_.Narrow(r.params + at * element, r.master + at, end - begin, b.dtype));
  });
  return status;
}

StatusOr<std::vector<OptimizerState::OwnedPart>> OptimizerState::ReadOwned(int param) const {
  std::vector<OwnedPart> parts;
  std::vector<float> scratch;
  ZERO_RETURN_IF_ERROR(VisitOwned(param, &scratch, [&](int64_t begin, int64_t numel, const float* values) {
    parts.push_back({begin, numel, std::vector<float>(values, values + scratch.size())});
    return absl::OkStatus();
  }));
  return parts;
}

Status OptimizerState::VisitOwned(
    int param, std::vector<float>* scratch,
    const std::function<Status(int64_t begin, int64_t numel, const float* values)>& fn) const {
  const int64_t offset = plan_.placement(param).offset;
  Status status = absl::OkStatus();
  ForOwnedPart(param, [&](const OwnedRange& r, int64_t begin, int64_t end) {
    if (!status.ok()) return;
    const int64_t at = begin - r.begin, n = end - begin;
    scratch->resize(static_cast<size_t>(n * (1 + state_count())));
    float* to = scratch->data();
    for (const float* from : {r.master + at, StateAt(state0_, r, at), StateAt(state1_, r, at)}) {
      if (from == nullptr) continue;
      status.Update(ops_.Copy(to, from, n * 4));
      to += n;
    }
    if (status.ok()) status = fn(begin - offset, n, scratch->data());
  });
  return status;
}

Status OptimizerState::VisitOwnedGrad(
    int param, std::vector<float>* scratch,
    const std::function<Status(int64_t begin, int64_t numel, const float* values)>& fn) const {
  const auto& place = plan_.placement(param);
  const partition::Bucket& b = plan_.buckets()[place.bucket];
  const int64_t element = b.grad_element_bytes();
  const char* lent = static_cast<const char*>(grads_.LentGrad(param));
  std::vector<uint16_t> narrow;
  Status status = absl::OkStatus();
  ForOwnedPart(param, [&](const OwnedRange& r, int64_t begin, int64_t end) {
    if (!status.ok()) return;
    const int64_t n = end - begin;
    const char* from = lent != nullptr ? lent + (begin - place.offset) * element
                                       : static_cast<const char*>(grads_.OwnedGrad(r.bucket)) + (begin - r.begin) * element;
    scratch->resize(static_cast<size_t>(n));
    if (b.grad_dtype == DType::kFP32) {
      status.Update(ops_.Copy(scratch->data(), from, n * element));
    } else {
      narrow.resize(static_cast<size_t>(n));
      status.Update(ops_.Copy(narrow.data(), from, n * element));
      for (int64_t i = 0; i < n; ++i) {
        (*scratch)[i] = b.grad_dtype == DType::kBF16 ? Bf16ToFloat(narrow[i]) : HalfToFloat(narrow[i]);
      }
    }
    if (status.ok()) status = fn(begin - place.offset, n, scratch->data());
  });
  return status;
}

std::vector<std::pair<int64_t, int64_t>> OptimizerState::OwnedExtents(int param) const {
  const int64_t offset = plan_.placement(param).offset;
  std::vector<std::pair<int64_t, int64_t>> extents;
  ForOwnedPart(param, [&](const OwnedRange&, int64_t begin, int64_t end) {
    extents.emplace_back(begin - offset, end - begin);
  });
  return extents;
}

Status OptimizerState::WriteOwned(int param, const std::vector<OwnedPart>& parts) {
  const int64_t offset = plan_.placement(param).offset;
  size_t next = 0;
  Status status = absl::OkStatus();
  ForOwnedPart(param, [&](const OwnedRange& r, int64_t begin, int64_t end) {
    const int64_t at = begin - r.begin, n = end - begin;
    if (next >= parts.size() || parts[next].begin != begin - offset || parts[next].numel != n) {
      status.Update(absl::InternalError("WriteOwned: the parts do not match the owned ranges"));
      return;
    }
    const float* from = parts[next++].values.data();
    for (float* to : {r.master + at, StateAt(state0_, r, at), StateAt(state1_, r, at)}) {
      if (to == nullptr) continue;
      status.Update(ops_.Copy(to, from, n * 4));
      from += n;
    }
  });
  ZERO_RETURN_IF_ERROR(status);
  return RoundModelCopy(param);
}

Status OptimizerState::GradSquaredNorm(float* sq_norm) {
  // Where some gradients are lent (one rank: the shard is the whole bucket), per param
  // instead, each where it is (the padding left out holds zeros).
  std::vector<std::vector<kernels::ConstSpan>> per_param(grads_.any_lent() ? batches_.size() : 0);
  std::vector<NormBatch> batches;
  for (size_t i = 0; i < batches_.size(); ++i) {
    const Batch& batch = batches_[i];
    if (per_param.empty()) {
      batches.push_back({batch.norm_spans, batch.types.grad});
      continue;
    }
    for (const Fragment& f : batch.fragments) {
      per_param[i].push_back({WithLentGrad(f.param, f.param_begin, f.segment).grad, f.segment.numel});
    }
    batches.push_back({per_param[i], batch.types.grad});
  }
  return ops_.SquaredNormOnDevice(batches, sq_norm);
}

kernels::Segment OptimizerState::WithLentGrad(int param, int64_t param_begin, kernels::Segment segment) const {
  const void* lent = grads_.LentGrad(param);
  if (lent != nullptr) {
    const int64_t element = plan_.buckets()[plan_.placement(param).bucket].grad_element_bytes();
    segment.grad = static_cast<const char*>(lent) + param_begin * element;
  }
  return segment;
}

Status OptimizerState::Launch(const OptimizerHyper& o, int64_t step, const kernels::StepCommon& common,
                              kernels::SegmentTypes types, const std::vector<kernels::Segment>& segments) {
  switch (config_.optimizer.type) {
    case OptimizerType::kAdam:
    case OptimizerType::kAdamW: {
      auto h = AdamFamilyHyper<kernels::AdamHyper>(o, step, common);
      h.decoupled_weight_decay = config_.optimizer.type == OptimizerType::kAdamW;
      return ops_.AdamStep(h, types, segments);
    }
    case OptimizerType::kSgd: {
      kernels::SgdHyper h;
      h.lr = o.lr;
      h.momentum = o.momentum;
      h.dampening = o.dampening;
      h.weight_decay = o.weight_decay;
      h.nesterov = o.nesterov;
      h.step = step;
      h.common = common;
      return ops_.SgdStep(h, types, segments);
    }
    case OptimizerType::kLion: {
      kernels::LionHyper h;
      h.lr = o.lr;
      h.beta1 = o.beta1;
      h.beta2 = o.beta2;
      h.weight_decay = o.weight_decay;
      h.common = common;
      return ops_.LionStep(h, types, segments);
    }
    case OptimizerType::kLamb:
      break;
  }
  return absl::InternalError("Launch: LAMB steps through LambStep");
}

namespace {

// A param's step count as the kernels take it (a param put back after the step may have 0).
int64_t KernelStep(const std::vector<int64_t>& param_steps, int param) {
  return std::max<int64_t>(1, param_steps[param]);
}

}  // namespace

Status OptimizerState::Step(const std::vector<OptimizerHyper>& groups, const std::vector<int64_t>& param_steps,
                            const kernels::StepCommon& common, float* sq_norm) {
  const bool sum_squares = sq_norm != nullptr;
  if (sum_squares && !squares_in_step()) {
    return absl::InternalError("OptimizerState::Step: a squared norm asked of a step that cannot sum it");
  }
  if (config_.optimizer.type == OptimizerType::kLamb) return LambStep(groups, param_steps, common);
  int64_t partials = 0;  // the squares' partials written so far, one per block (squares_ holds every plan's)
  auto launch = [&](const Batch& batch, int64_t step, const std::vector<kernels::Segment>& segments) {
    kernels::StepCommon launch_common = common;
    if (sum_squares) launch_common.grad_squares = squares_.as<double>() + partials;
    partials += kernels::LaunchBlocks(segments);
    return Launch(groups[batch.group], step, launch_common, batch.types, segments);
  };
  for (const Batch& batch : batches_) {
    std::map<int64_t, std::vector<kernels::Segment>> by_step;
    for (const Fragment& f : batch.fragments) by_step[KernelStep(param_steps, f.param)];
    if (by_step.size() <= 1 && !grads_.any_lent()) {  // the usual case: the whole batch at one count
      ZERO_RETURN_IF_ERROR(launch(batch, by_step.empty() ? 1 : by_step.begin()->first, batch.segments));
      continue;
    }
    // Per param: once guard.on_unused = "zero" has left a param untouched the counts differ
    // for good, and a lent gradient is read where it is.
    for (const Fragment& f : batch.fragments) {
      by_step[KernelStep(param_steps, f.param)].push_back(WithLentGrad(f.param, f.param_begin, f.segment));
    }
    for (const auto& [step, segments] : by_step) ZERO_RETURN_IF_ERROR(launch(batch, step, segments));
  }
  return sum_squares ? ops_.SumPartials(squares_.as<double>(), partials, sq_norm) : absl::OkStatus();
}

template <typename Fn>
void OptimizerState::CutPerParam(const OwnedRange& r, const kernels::Segment& whole, Fn fn) const {
  const partition::Bucket& b = plan_.buckets()[r.bucket];
  const int64_t element = b.element_bytes(), grad_element = b.grad_element_bytes();
  for (int param : b.params) {  // padding between params is left out: it never moves
    ForOwnedPart(param, [&](const OwnedRange& range, int64_t begin, int64_t end) {
      if (&range != &r) return;
      const int64_t at = begin - r.begin;
      kernels::Segment seg = whole;
      seg.master = whole.master + at;
      seg.model_param = whole.model_param ? static_cast<char*>(whole.model_param) + at * element : nullptr;
      seg.grad = static_cast<const char*>(whole.grad) + at * grad_element;
      seg.state0 = whole.state0 ? whole.state0 + at : nullptr;
      seg.state1 = whole.state1 ? whole.state1 + at : nullptr;
      seg.numel = end - begin;
      fn(param, seg, at);
    });
  }
}

Status OptimizerState::AddMomentumBuffer() {
  if (config_.optimizer.type != OptimizerType::kSgd || state0_.bytes() > 0) return absl::OkStatus();
  int64_t state_numel = 0;
  for (const OwnedRange& r : ranges_) state_numel += r.numel;
  ZERO_ASSIGN_OR_RETURN(state0_, allocator_.Allocate(state_numel * 4, MemoryCategory::kOptimizer, ops_.placement()));
  ZERO_RETURN_IF_ERROR(ops_.Zero(state0_.data(), state0_.bytes()));
  float* base = state0_.as<float>();
  for (Batch& batch : batches_) {
    for (size_t i = 0; i < batch.segments.size(); ++i) batch.segments[i].state0 = base + batch.segment_state_begins[i];
    for (Fragment& f : batch.fragments) f.segment.state0 = base + f.state_begin;
  }
  return absl::OkStatus();
}

Status OptimizerState::LambStep(const std::vector<OptimizerHyper>& groups, const std::vector<int64_t>& param_steps,
                                const kernels::StepCommon& common) {
  auto hyper_of = [&](const Batch& batch, int64_t step) {
    return AdamFamilyHyper<kernels::LambHyper>(groups[batch.group], step, common);
  };
  // LAMB needs a trust ratio per param, so it steps each batch's per-param fragments.
  // Pass 1: moments and the update direction (one launch per distinct step count); then ‖w‖²
  // and ‖u‖² per param, summed over ranks.
  std::vector<float> sums(2 * plan_.params().size(), 0.0f);
  for (const Batch& batch : batches_) {
    std::map<int64_t, std::pair<std::vector<kernels::Segment>, std::vector<float*>>> by_step;
    std::vector<kernels::ConstSpan> weights, updates;
    for (const Fragment& f : batch.fragments) {
      auto& [segments, directions] = by_step[KernelStep(param_steps, f.param)];
      segments.push_back(WithLentGrad(f.param, f.param_begin, f.segment));
      directions.push_back(LambUpdateOf(f));
      weights.push_back({f.segment.master, f.segment.numel});
      updates.push_back({LambUpdateOf(f), f.segment.numel});
    }
    for (const auto& [step, launch] : by_step) {
      ZERO_RETURN_IF_ERROR(ops_.LambUpdate(hyper_of(batch, step), batch.types, launch.first, launch.second));
    }
    std::vector<double> weight_norms(weights.size()), update_norms(updates.size());
    kernels::NormResult total;
    ZERO_RETURN_IF_ERROR(ops_.SquaredNorms(weights, DType::kFP32, absl::MakeSpan(weight_norms), &total));
    ZERO_RETURN_IF_ERROR(ops_.SquaredNorms(updates, DType::kFP32, absl::MakeSpan(update_norms), &total));
    for (size_t i = 0; i < batch.fragments.size(); ++i) {
      sums[2 * batch.fragments[i].param] += static_cast<float>(weight_norms[i]);
      sums[2 * batch.fragments[i].param + 1] += static_cast<float>(update_norms[i]);
    }
  }
  if (sum_over_ranks_) ZERO_RETURN_IF_ERROR(sum_over_ranks_(sums));
  // Pass 2: w -= lr · ‖w‖/‖u‖ · u, per param (the step count plays no part).
  for (const Batch& batch : batches_) {
    std::vector<kernels::Segment> segments;
    std::vector<const float*> updates;
    std::vector<float> ratios;
    for (const Fragment& f : batch.fragments) {
      segments.push_back(f.segment);
      updates.push_back(LambUpdateOf(f));
      ratios.push_back(kernels::LambTrustRatio(sums[2 * f.param], sums[2 * f.param + 1]));
    }
    ZERO_RETURN_IF_ERROR(ops_.LambApply(hyper_of(batch, 1), batch.types.param, segments, updates, ratios));
  }
  return absl::OkStatus();
}

}  // namespace zero::runtime
