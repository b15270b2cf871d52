// The NCCL communicator's watchdog: a thread that watches the collectives a stream was made to
// wait for (Work::WaitOnStream). Nobody on the host waits for those, so a peer that never
// joins would otherwise hang the trainer the next time it synchronises; the watchdog breaks
// the group instead once one is not complete within its timeout, or when NCCL reports an
// asynchronous error (breaking aborts the NCCL communicator, which ends its kernels, so the
// stream goes on and every later call fails with the error). As PyTorch's ProcessGroupNCCL
// watchdog does.
#ifndef ZERO_COMM_NCCL_NCCL_WATCHDOG_H_
#define ZERO_COMM_NCCL_NCCL_WATCHDOG_H_

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/nccl/nccl_events.h"
#include "zero/status.h"

namespace zero::comm {

class NcclWatchdog {
 public:
  /// Runs on CUDA device `device`. `fail(status)` breaks the group; `async_error()` is NCCL's
  /// asynchronous error, polled with the events.
  NcclWatchdog(int device, std::function<void(const Status&)> fail, std::function<Status()> async_error);
  /// Stops the thread (the watched collectives are forgotten).
  ~NcclWatchdog();
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  /// Watches `done` until its event completes; not complete `timeout_s` seconds from now, it
  /// fails the group. Starts the thread at the first call.
  void Watch(std::shared_ptr<DoneEvent> done, double timeout_s);

 private:
  struct Watched {
    std::shared_ptr<DoneEvent> done;
    std::chrono::steady_clock::time_point deadline;
    double timeout_s;
  };
  void Run();
  // One pass over `watched`: drops the completed; the first failure, if any.
  Status Check(std::vector<Watched>* watched) const;

  const int device_;
  const std::function<void(const Status&)> fail_;
  const std::function<Status()> async_error_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Watched> incoming_;  // handed over by Watch, taken by the thread
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zero::comm

#endif  // ZERO_COMM_NCCL_NCCL_WATCHDOG_H_
