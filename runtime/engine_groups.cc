// Optimizer groups: each group's hyperparameters (config optimizer.param_groups, changed
// between steps by SetGroupHyper), and the learning-rate schedule that sets their lr.
#include "absl/strings/str_cat.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {

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
  ZERO_RETURN_IF_ERROR(ValidateOptimizerHyper(hyper, absl::StrCat("SetGroupHyper: group ", group)));
  groups_[group] = hyper;
  return absl::OkStatus();
}

}  // namespace zero::runtime
