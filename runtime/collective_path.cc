// The stream wait before a collective, bounded waits that name what they waited for, and the
// works the stream waits for instead of the host.
#include "runtime/collective_path.h"

#include "absl/strings/str_cat.h"

namespace zero::runtime {
namespace {

// `status` with "what: " before its message; OK stays OK.
Status Prefixed(const Status& status, absl::string_view what) {
  return status.ok() ? status : Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

}  // namespace

bool CollectivePath::OrderedOnOurStream() const {
  return comm_.ordered_after_stream() && comm_.stream() == ops_.stream();
}

bool CollectivePath::NeedsStreamWait() const { return ops_.asynchronous() && !OrderedOnOurStream(); }

Status CollectivePath::MakeStreamWorkVisible() {
  return NeedsStreamWait() ? ops_.Synchronize() : absl::OkStatus();
}

bool CollectivePath::StreamCanWait() const { return ops_.asynchronous() && OrderedOnOurStream(); }

comm::WorkPtr CollectivePath::Start(const Launch& launch) {
  Status ready = Reap();
  if (ready.ok()) ready = MakeStreamWorkVisible();
  return ready.ok() ? launch(comm_) : comm::CompletedWork(std::move(ready));
}

Status CollectivePath::WaitOnStream(comm::WorkPtr& work, const Describe& what) {
  if (work == nullptr) return absl::OkStatus();
  // Complete already (a copy at world size 1, an error found before launch): its outcome now.
  if (!StreamCanWait() || work->Test()) return Wait(work, what());
  const Status ordered = work->WaitOnStream(ops_.stream(), timeout_s_);
  if (!ordered.ok()) {
    work.reset();
    return Prefixed(ordered, what());
  }
  kept_.push_back({std::move(work), what});
  return Reap();
}

Status CollectivePath::Reap() {
  Status first;
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (!it->work->Test()) {  // its timeout is the communicator's watchdog's
      ++it;
      continue;
    }
    const Status status = it->work->Wait(comm::kNoTimeout);  // complete: its outcome, at once
    if (!status.ok() && first.ok()) first = Prefixed(status, it->what());
    it = kept_.erase(it);
  }
  return first;
}

Status CollectivePath::Drain() {
  Status first;
  while (!kept_.empty()) {
    Kept kept = std::move(kept_.front());
    kept_.pop_front();
    const Status status = Block(*kept.work, timeout_s_);
    if (!status.ok() && first.ok()) first = Prefixed(status, kept.what());
  }
  return first;
}

Status CollectivePath::Block(comm::Work& work, double timeout_s) {
  if (!work.Test()) ++waits_;
  return work.Wait(timeout_s);
}

Status CollectivePath::Wait(comm::WorkPtr& work, absl::string_view what) {
  if (work == nullptr) return absl::OkStatus();
  const Status status = Block(*work, timeout_s_);
  work.reset();
  return Prefixed(status, what);
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
