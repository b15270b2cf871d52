// The gradient guard's bookkeeping and messages.
#include "runtime/grad_guard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zero::runtime {
namespace {

constexpr int kListedParams = 20;

}  // namespace

GradGuard::GradGuard(const GuardConfig& config, std::vector<std::string> names,
                     std::vector<int> bucket_of)
    : config_(config), names_(std::move(names)), bucket_of_(std::move(bucket_of)),
      count_(names_.size(), 0), first_arrival_(names_.size(), -1), complete_(names_.size(), 0),
      expected_(names_.size(), kNotLearned), used_in_step_(names_.size(), 0) {}

std::string GradGuard::Label(int param) const {
  return absl::StrCat("\"", names_[param], "\" (index ", param, ")");
}

void GradGuard::BeginMicroBatch(int64_t iteration) {
  iteration_ = iteration;
  arrivals_ = 0;
  std::fill(count_.begin(), count_.end(), 0);
  std::fill(first_arrival_.begin(), first_arrival_.end(), -1);
  std::fill(complete_.begin(), complete_.end(), 0);
}

Status GradGuard::Duplicate(int param, bool bucket_launched) const {
  return DuplicateGradientError(absl::StrCat(
      "param ", Label(param), " received a second gradient in iteration ", iteration_, " (arrivals #",
      first_arrival_[param], " and #", arrivals_, " of this iteration); its bucket ", bucket_of_[param],
      bucket_launched ? " had already been reduced" : " was still waiting for other params",
      ". The first gradient is intact and this one was not taken. Likely causes: reentrant "
      "activation checkpointing (use_reentrant=True) runs backward through this param twice — use "
      "non-reentrant checkpointing; or the weight is used twice (tied embeddings, a module called "
      "twice) — set guard.on_duplicate = \"count\" to reduce once every contribution has arrived (in a "
      "DeepSpeed config too: \"guard\": {\"on_duplicate\": \"count\"}), or, calling the engine "
      "yourself, add both contributions before calling GradReady"));
}

Status GradGuard::CheckWritable(int param, bool bucket_launched) const {
  if (!complete_[param]) return absl::OkStatus();
  if (config_.on_duplicate == DuplicatePolicy::kCount) return GraphChanged(param);
  return Duplicate(param, bucket_launched);
}

Status GradGuard::GraphChanged(int param) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "the graph changed: param ", Label(param), " received gradient #", count_[param] + 1,
      " in iteration ", iteration_, " but the iteration that learned its count delivered ", expected_[param],
      " (guard.on_duplicate = \"count\" needs the same number of gradients per param in every "
      "iteration, like DDP's static graph); nothing was changed"));
}

bool GradGuard::LearnsAtEnd(int param) const {
  return config_.on_duplicate == DuplicatePolicy::kCount && expected_[param] == kNotLearned;
}

Status GradGuard::Arrive(int param, bool bucket_launched, bool* complete) {
  *complete = false;
  const int position = arrivals_;
  if (complete_[param]) {
    return config_.on_duplicate == DuplicatePolicy::kCount ? GraphChanged(param)
                                                            : Duplicate(param, bucket_launched);
  }
  ++arrivals_;
  if (first_arrival_[param] < 0) first_arrival_[param] = position;
  ++count_[param];
  used_in_step_[param] = 1;
  if (LearnsAtEnd(param)) return absl::OkStatus();  // completes at EndBackward
  if (config_.on_duplicate != DuplicatePolicy::kCount || count_[param] == expected_[param]) {
    complete_[param] = 1;
    *complete = true;
  }
  return absl::OkStatus();
}

Status GradGuard::AtEndBackward(int rank, std::vector<int>* to_complete, bool abandon) {
  to_complete->clear();
  if (!abandon) ZERO_RETURN_IF_ERROR(CheckAtEndBackward(rank));
  for (size_t p = 0; p < names_.size(); ++p) {
    if (bucket_of_[p] < 0 || complete_[p]) continue;
    // Learned where it arrived (an unused param, under on_unused = zero, is learned later);
    // an abandoned (unfinished) graph teaches nothing.
    if (!abandon && LearnsAtEnd(static_cast<int>(p)) && count_[p] > 0) expected_[p] = count_[p];
    complete_[p] = 1;
    to_complete->push_back(static_cast<int>(p));
  }
  return absl::OkStatus();
}

Status GradGuard::CheckAtEndBackward(int rank) const {
  std::vector<std::string> unused, partial;
  int unused_count = 0;
  for (size_t p = 0; p < names_.size(); ++p) {
    if (bucket_of_[p] < 0) continue;  // frozen
    if (count_[p] == 0) {
      if (++unused_count <= kListedParams) unused.push_back(Label(static_cast<int>(p)));
    } else if (!LearnsAtEnd(static_cast<int>(p)) && !complete_[p] && partial.size() < kListedParams) {
      partial.push_back(absl::StrCat(Label(static_cast<int>(p)), ": ", count_[p], " of ", expected_[p]));
    }
  }
  if (!partial.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the graph changed: in iteration ", iteration_, " these params received fewer gradients than "
        "the iteration that learned their count (guard.on_duplicate = \"count\"): ", absl::StrJoin(partial, ", ")));
  }
  if (unused_count > 0 && config_.on_unused == UnusedPolicy::kError) {
    return UnusedParametersError(absl::StrCat(
        "rank ", rank, ": ", unused_count, " param(s) got no gradient in iteration ", iteration_, ": ",
        absl::StrJoin(unused, ", "), unused_count > kListedParams ? ", …" : "",
        ". Typical causes: a branch of the model skipped on this rank, or a layer that is "
        "registered but never used. Fixes: call GradReady for them (a zero gradient), mark them "
        "requires_grad = false if they are never trained, or set guard.on_unused = \"zero\" (ranks that "
        "skip a param contribute zeros; a param no rank used is left untouched by the step)"));
  }
  return absl::OkStatus();
}

Status GradGuard::Absent(int param, bool* complete) {
  *complete = false;
  if (config_.on_unused != UnusedPolicy::kZero) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GradAbsent(", Label(param), "): only under guard.on_unused = \"zero\" may a param go without a gradient"));
  }
  if (count_[param] > 0 || complete_[param]) {
    return absl::FailedPreconditionError(absl::StrCat("GradAbsent(", Label(param), "): it already received a gradient "
                                                      "in iteration ", iteration_));
  }
  complete_[param] = 1;
  *complete = true;
  return absl::OkStatus();
}

void GradGuard::EndStep() { std::fill(used_in_step_.begin(), used_in_step_.end(), 0); }

}  // namespace zero::runtime
