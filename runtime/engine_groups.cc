// Optimizer groups: each group's hyperparameters (config optimizer.param_groups, changed
// between steps by SetGroupHyper), checked to agree across ranks at each step, and the
// learning-rate schedule that sets their lr.
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {

std::string Shortest(float value) {
  for (int digits = 6; digits < 9; ++digits) {
    const std::string text = absl::StrFormat("%.*g", digits, value);
    if (std::strtof(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.9g", value);
}

void EngineImpl::InitGroups() {
  int count = static_cast<int>(config_.optimizer.param_groups.size());
  for (const ParamSpec& spec : specs_) count = std::max(count, spec.group + 1);
  groups_.clear();
  std::vector<float> base_lrs;
  for (int g = 0; g < count; ++g) {
    groups_.push_back(config_.optimizer.Group(g));
    base_lrs.push_back(groups_.back().lr);
  }
  if (config_.scheduler.type != LrScheduleType::kNone) {
    schedule_.emplace(config_.scheduler, std::move(base_lrs));
    ApplySchedule();
  }
}

void EngineImpl::ApplySchedule() {
  if (!schedule_) return;
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].lr = schedule_->Lr(lr_schedule_iteration(), static_cast<int>(g));
  }
}

StatusOr<OptimizerHyper> EngineImpl::GroupHyper(int group) const {
  if (phase_ == Phase::kRegistering) return RequirePhase(Phase::kIdle, "GroupHyper");
  if (group < 0 || group >= num_groups()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GroupHyper: group ", group, " does not exist; groups are 0 to ", num_groups() - 1));
  }
  return groups_[group];
}

Status EngineImpl::SetGroupHyper(int group, const OptimizerHyper& hyper) {
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "SetGroupHyper"));
  if (group < 0 || group >= num_groups()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetGroupHyper: group ", group, " does not exist; groups are 0 to ", num_groups() - 1));
  }
  if (Status valid = ValidateOptimizerHyper(hyper, absl::StrCat("optimizer.param_groups[", group, "]")); !valid.ok()) {
    return Status(valid.code(), absl::StrCat("SetGroupHyper: ", valid.message(), "; nothing changed"));
  }
  if (hyper.momentum != 0.0f) ZERO_RETURN_IF_ERROR(optimizer_->AddMomentumBuffer());  // SGD built without
  groups_[group] = hyper;
  return absl::OkStatus();
}

Status EngineImpl::CheckGroupsAgree() {
  if (comm_.size() == 1 || !ReadsNormOnHost()) return absl::OkStatus();
  // Every setting of every group, then each negated: one max over the ranks gives each
  // setting's maximum and minimum, equal exactly when every rank has the same value.
  using Setting = std::pair<const char*, float OptimizerHyper::*>;
  static constexpr Setting kSettings[] = {
      {"lr", &OptimizerHyper::lr},       {"beta1", &OptimizerHyper::beta1},
      {"beta2", &OptimizerHyper::beta2}, {"eps", &OptimizerHyper::eps},
      {"weight_decay", &OptimizerHyper::weight_decay}, {"momentum", &OptimizerHyper::momentum},
      {"dampening", &OptimizerHyper::dampening}};
  constexpr size_t kPerGroup = std::size(kSettings) + 1;  // and nesterov
  const size_t n = groups_.size() * kPerGroup;
  std::vector<float> values(2 * n);
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t k = 0; k < kPerGroup; ++k) {
      const float value = k < std::size(kSettings) ? groups_[g].*kSettings[k].second : (groups_[g].nesterov ? 1.0f : 0.0f);
      values[g * kPerGroup + k] = value;
      values[n + g * kPerGroup + k] = -value;
    }
  }
  const std::vector<float> mine(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n));
  Status reduced = host_.AllReduce(values.data(), static_cast<int64_t>(values.size()), comm::ReduceOp::kMax);
  if (!reduced.ok()) return Status(reduced.code(), absl::StrCat("Step: comparing the optimizer settings: ", reduced.message()));
  for (size_t i = 0; i < n; ++i) {
    const float highest = values[i], lowest = -values[n + i];
    if (highest == lowest) continue;
    const size_t k = i % kPerGroup;
    return absl::FailedPreconditionError(absl::StrCat(
        "Step: the ranks would step with different optimizer settings: group ", i / kPerGroup, "'s ",
        k < std::size(kSettings) ? kSettings[k].first : "nesterov", " is ", Shortest(lowest),
        " on one rank and ", Shortest(highest), " on another (", Shortest(mine[i]),
        " on this rank). Each rank steps its own shard of the params (stages 1-3), so "
        "the model would mix them silently, and at stage 0 the replicas would drift apart. Set the same values on "
        "every rank: step the lr scheduler on every rank, not only on rank 0. Nothing was stepped; Step may be "
        "called again once they agree."));
  }
  return absl::OkStatus();
}

}  // namespace zero::runtime
