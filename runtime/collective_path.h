// (Internal to runtime.) The engine's one path to the communicator: the bucket reductions
// (through the BucketScheduler), the parameter all-gathers after a step, stage 3's unit
// gathers, the replica broadcasts and the host collectives all start here.
// On a GPU with a communicator that does not order itself after the engine's stream (local,
// MPI), the kernels queued on that stream finish first, so a collective never reads a buffer a
// kernel is still writing; every wait is bounded by guard.timeout_s and its error says what
// was being done. With one that does on the engine's own stream (NCCL), nothing waits on the
// host: the stream waits for each collective (WaitOnStream), and the collective's Work is kept
// until it completes; its timeout is the communicator's watchdog's, its errors Reap's.
#ifndef ZERO_RUNTIME_COLLECTIVE_PATH_H_
#define ZERO_RUNTIME_COLLECTIVE_PATH_H_

#include <deque>
#include <functional>
#include <string>

#include "absl/strings/string_view.h"
#include "runtime/device_ops.h"
#include "zero/communicator.h"

namespace zero::runtime {

class CollectivePath {
 public:
  /// Starts one collective on the communicator (e.g. `[&](Communicator& c) { return c.AllGather(...); }`).
  using Launch = std::function<comm::WorkPtr(comm::Communicator&)>;
  /// What a collective is, for its error message (called only on an error).
  using Describe = std::function<std::string()>;

  /// Waits are bounded by `timeout_s` (0: forever).
  CollectivePath(comm::Communicator& comm, DeviceOps& ops, double timeout_s)
      : comm_(comm), ops_(ops), timeout_s_(timeout_s) {}

  /// Makes the engine's queued kernels visible to the communicator where it needs that (see
  /// the file comment), then starts `launch`. A failed stream wait, or an error Reap found,
  /// becomes the work's error.
  comm::WorkPtr Start(const Launch& launch);
  /// Where the communicator orders itself after the stream and the device queues work (nccl
  /// on "cuda"): the engine's stream waits for `work` and the host does not; the work is kept
  /// until it completes. Elsewhere, Wait. `work` is null afterwards; an error is prefixed with
  /// what(). A null `work` is OK.
  Status WaitOnStream(comm::WorkPtr& work, const Describe& what);
  /// Drops the kept works that completed; the first error among them (prefixed with its
  /// what()). Never blocks. A kept work that never completes is the communicator's to time
  /// out (Work::WaitOnStream: its watchdog breaks the group after the timeout).
  Status Reap();
  /// Waits on the host for every kept work, within the timeout each; the first error.
  Status Drain();
  /// Works kept by WaitOnStream, not yet reaped.
  int kept() const { return static_cast<int>(kept_.size()); }
  /// Whether WaitOnStream may keep a work for the stream to wait on (else it waits on the host).
  bool waits_on_stream() const { return StreamCanWait(); }
  /// Waits for `work` within the timeout and drops it; an error is prefixed with `what`. A
  /// null `work` is OK.
  Status Wait(comm::WorkPtr& work, absl::string_view what);
  /// Waits for `work` within `timeout_s` (0: forever), counting a host wait when it was not
  /// complete yet.
  Status Block(comm::Work& work, double timeout_s);
  /// How many times the host waited so far: for a collective not yet complete, or for the
  /// device's queued kernels before a collective (and the device's own waits, DeviceOps).
  int64_t host_waits() const { return waits_ + ops_.host_waits(); }
  /// Start and Wait.
  Status Run(const Launch& launch, absl::string_view what);
  /// Run without the stream wait, for collectives on host memory no kernel writes (the
  /// engine's host scratch).
  Status RunOnHostMemory(const Launch& launch, absl::string_view what);
  /// The stream wait alone, before the host reads device values the stream may still write.
  Status MakeStreamWorkVisible();

  comm::Communicator& comm() { return comm_; }
  double timeout_s() const { return timeout_s_; }

 private:
  struct Kept {
    comm::WorkPtr work;
    Describe what;
  };
  // Whether the communicator orders its collectives after the engine's own stream.
  bool OrderedOnOurStream() const;
  bool NeedsStreamWait() const;
  bool StreamCanWait() const;

  comm::Communicator& comm_;
  DeviceOps& ops_;
  const double timeout_s_;
  int64_t waits_ = 0;
  std::deque<Kept> kept_;
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_COLLECTIVE_PATH_H_
