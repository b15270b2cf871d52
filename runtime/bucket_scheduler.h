// (Internal to runtime: the engine's policy for its bucket collectives.)
// Launches bucket collectives strictly in bucket order, as soon as each bucket and every
// earlier one is ready, so ranks whose gradients arrive in different orders still issue
// identical collective sequences; then waits for them and runs each bucket's completion step.
#ifndef ZERO_RUNTIME_BUCKET_SCHEDULER_H_
#define ZERO_RUNTIME_BUCKET_SCHEDULER_H_

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "zero/communicator.h"

namespace zero::runtime {

class BucketScheduler {
 public:
  /// Starts a bucket's collective; null for a bucket with nothing to send this time.
  using Launch = std::function<comm::WorkPtr()>;
  /// Runs after the bucket's collective completed successfully (accumulate, release buffers).
  using Finish = std::function<Status()>;
  /// Called for each bucket as it is launched (bucket index), for counters and logs.
  using OnLaunch = std::function<void(int)>;
  /// Describes a bucket in error messages (e.g. its params); default "bucket N".
  using Describe = std::function<std::string(int)>;

  explicit BucketScheduler(int num_buckets, OnLaunch on_launch = nullptr, Describe describe = nullptr);

  /// Forgets the previous round; every bucket becomes not ready. Requires nothing in flight.
  Status Reset();
  /// Marks bucket `b` ready and launches every bucket that is now next in order.
  /// kFailedPrecondition if `b` was already marked this round.
  Status MarkReady(int bucket, Launch launch, Finish finish);
  /// Waits for the oldest collective in flight and runs its Finish. kFailedPrecondition if
  /// nothing is in flight. `timeout_s` > 0 bounds the wait (kDeadlineExceeded names the bucket).
  Status WaitOldest(double timeout_s);
  /// Waits for everything in flight. Buckets not yet launched stay pending.
  Status WaitAll(double timeout_s);

  int in_flight() const { return static_cast<int>(in_flight_.size()); }

 private:
  struct Entry {
    bool ready = false;
    Launch launch;
    Finish finish;
  };
  struct Flight {
    int bucket;
    comm::WorkPtr work;
    Finish finish;
  };
  std::vector<Entry> entries_;
  std::deque<Flight> in_flight_;
  int next_ = 0;
  OnLaunch on_launch_;
  Describe describe_;
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_BUCKET_SCHEDULER_H_
