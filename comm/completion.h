// A one-shot completion flag with a Status, waited on with an optional timeout: the shared
// core of the backends' Work objects (internal to comm).
#ifndef ZERO_COMM_COMPLETION_H_
#define ZERO_COMM_COMPLETION_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "zero/communicator.h"
#include "zero/status.h"

namespace zero::comm {

/// Waits on `signal` (with `lock` held on its mutex) until `done()`; with timeout_s > 0 gives
/// up after that long (capped at kLongestWaitSeconds) and returns false.
template <typename Done>
bool WaitUntilDone(std::condition_variable& signal, std::unique_lock<std::mutex>& lock, double timeout_s,
                   Done done) {
  if (timeout_s <= 0) {
    signal.wait(lock, done);
    return true;
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::min(timeout_s, kLongestWaitSeconds)));
  return signal.wait_until(lock, deadline, done);
}

class Completion {
 public:
  /// Marks the event done with `status` and wakes every waiter. Later calls are ignored.
  void Complete(Status status) { CompleteAfter(nullptr, std::move(status)); }

  /// Runs `finish` (may be null) and marks the event done with `status`, or with `finish`'s
  /// error when `status` is OK and it fails (a copy out of staging memory, say), atomically
  /// with respect to Abandon: once Abandon() returned true, `finish` never runs (it would write
  /// into buffers the abandoning caller may have freed).
  void CompleteAfter(const std::function<Status()>& finish, Status status) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done_) return;
      if (finish && !abandoned_) {
        Status finished = finish();
        if (status.ok()) status = std::move(finished);
      }
      done_ = true;
      status_ = std::move(status);
    }
    done_signal_.notify_all();
  }

  /// Runs `work` unless the waiter has abandoned the event (then returns false without running
  /// it): the same guarantee as CompleteAfter's, for work done before completion. The lock is
  /// not held while `work` runs (done() and Wait() stay responsive); Abandon() waits for it.
  bool RunUnlessAbandoned(const std::function<void()>& work) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (abandoned_ || done_) return false;
      working_ = true;
    }
    work();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      working_ = false;
    }
    done_signal_.notify_all();
    return true;
  }

  /// The waiter gives up: true if the event was not done (and now never runs its finish, nor
  /// any more work: work already running is waited for), false if it completed meanwhile
  /// (Wait then returns its status).
  bool Abandon() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (done_) return false;
    abandoned_ = true;
    done_signal_.wait(lock, [this] { return !working_; });
    return true;
  }

  /// True once Complete was called.
  bool done() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  /// Waits for completion; with timeout_s > 0 gives up after that long and returns false.
  /// On true, `*status` holds the outcome.
  bool Wait(double timeout_s, Status* status) const {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!WaitUntilDone(done_signal_, lock, timeout_s, [this] { return done_; })) return false;
    *status = status_;
    return true;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable done_signal_;
  bool done_ = false;
  bool abandoned_ = false;
  bool working_ = false;  // RunUnlessAbandoned's work is running
  Status status_;
};

}  // namespace zero::comm

#endif  // ZERO_COMM_COMPLETION_H_
