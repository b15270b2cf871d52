// The stream wait before a collective, and bounded waits that name what they waited for.
#include "runtime/collective_path.h"

#include "absl/strings/str_cat.h"

namespace zero::runtime {

bool CollectivePath::NeedsStreamWait() const {
  return ops_.asynchronous() && !comm_.ordered_after_stream();
}

Status CollectivePath::MakeStreamWorkVisible() {
  return NeedsStreamWait() ? ops_.Synchronize() : absl::OkStatus();
}

comm::WorkPtr CollectivePath::Start(const Launch& launch) {
  Status visible = MakeStreamWorkVisible();
  return visible.ok() ? launch(comm_) : comm::CompletedWork(std::move(visible));
}

Status CollectivePath::Block(comm::Work& work, double timeout_s) {
  if (!work.Test()) ++waits_;
  return work.Wait(timeout_s);
}

Status CollectivePath::Wait(comm::WorkPtr& work, absl::string_view what) {
  if (work == nullptr) return absl::OkStatus();
  Status status = Block(*work, timeout_s_);
  work.reset();
  if (status.ok()) return status;
  return Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

Status CollectivePath::Run(const Launch& launch, absl::string_view what) {
  comm::WorkPtr work = Start(launch);
  return Wait(work, what);
}

Status CollectivePath::RunOnHostMemory(const Launch& launch, absl::string_view what) {
  comm::WorkPtr work = launch(comm_);
  return Wait(work, what);
}

}  // namespace zero::runtime
