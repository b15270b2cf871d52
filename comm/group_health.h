// Whether a communicator's group still works: OK, or the first error that broke it (internal to
// comm). A group breaks, as after ncclCommAbort, when any of its collectives fails, times out or
// is abandoned; from then on every collective fails at once with that first error.
#ifndef ZERO_COMM_GROUP_HEALTH_H_
#define ZERO_COMM_GROUP_HEALTH_H_

#include <mutex>

#include "absl/strings/str_cat.h"
#include "zero/status.h"

namespace zero::comm {

class GroupHealth {
 public:
  /// Records `cause` as the reason the group broke unless an earlier cause is recorded; returns
  /// true for the call that broke it. An OK `cause` is ignored.
  bool Break(const Status& cause) {
    if (cause.ok()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!first_.ok()) return false;
    first_ = cause;
    return true;
  }

  /// OK, or the first cause.
  Status Get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return first_;
  }

  /// The error of a collective issued after the group broke: the first cause's code, its
  /// message, and what to do.
  Status BrokenError(const char* what) const {
    const Status first = Get();
    return Status(first.code(), absl::StrCat(
        what, " was not started: the communicator group is broken since an earlier collective "
        "failed (", first.message(), "). Every later collective fails; create new communicators "
        "(restart the job) and resume from the last checkpoint"));
  }

 private:
  mutable std::mutex mutex_;
  Status first_;
};

}  // namespace zero::comm

#endif  // ZERO_COMM_GROUP_HEALTH_H_
