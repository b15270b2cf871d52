// (Internal to runtime: the engine's policy for its bucket collectives.)
// Launches bucket collectives strictly in bucket order, as soon as each bucket and every
// earlier one is ready, so ranks whose gradients arrive in different orders still issue
// identical collective sequences; then waits for them (on the stream where the path can) and
// runs each bucket's completion step, queued after the collective.
// Every launch first passes the engine's check (guard.consistency_check) and then goes
// through the CollectivePath (the stream wait).
#ifndef ZERO_RUNTIME_BUCKET_SCHEDULER_H_
#define ZERO_RUNTIME_BUCKET_SCHEDULER_H_

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "runtime/collective_path.h"
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
  /// Runs just before a bucket's collective starts (bucket index); an error becomes that
  /// collective's error, reported by the wait, and nothing is sent.
  using BeforeLaunch = std::function<Status(int)>;
  /// Optional hooks; any may be empty.
  struct Hooks {
    OnLaunch on_launch;
    Describe describe;
    BeforeLaunch before_launch;
  };

  /// Collectives start through `path` (not owned; null: launched directly, for tests).
  explicit BucketScheduler(int num_buckets, CollectivePath* path = nullptr, Hooks hooks = {});

  /// Forgets the previous round; every bucket becomes not ready. Requires nothing in flight.
  Status Reset();
  /// Marks bucket `b` ready and launches every bucket that is now next in order.
  /// kFailedPrecondition if `b` was already marked this round.
  Status MarkReady(int bucket, Launch launch, Finish finish);
  /// Waits for the oldest collective in flight and runs its Finish. kFailedPrecondition if
  /// nothing is in flight. Through the path the engine's stream waits where it can
  /// (CollectivePath::WaitOnStream, bounded by the path's timeout), else the host; without a
  /// path the host waits, `timeout_s` > 0 bounding it. Errors name the bucket.
  Status WaitOldest(double timeout_s);
  /// Waits for everything in flight. Buckets not yet launched stay pending.
  Status WaitAll(double timeout_s);

  int in_flight() const { return static_cast<int>(in_flight_.size()); }
  /// The bucket that launches next (the first not marked ready this round; the bucket count
  /// once all have launched).
  int next_to_launch() const { return next_; }

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
  // Starts bucket `bucket`'s collective: the check, then the path.
  comm::WorkPtr Start(int bucket, const Launch& launch);

  int next_ = 0;
  CollectivePath* path_;
  Hooks hooks_;
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_BUCKET_SCHEDULER_H_
