// The CUDA events of the NCCL communicator: each collective's done event comes from a pool and
// goes back to it once neither the collective's Work nor the watchdog holds it, so a steady
// run creates no event per collective.
#ifndef ZERO_COMM_NCCL_NCCL_EVENTS_H_
#define ZERO_COMM_NCCL_NCCL_EVENTS_H_

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/status_converters.h"
#include "zero/status.h"

namespace zero::comm {

/// Events without timing, reused. Thread-safe (the watchdog gives events back too).
class EventPool {
 public:
  EventPool() = default;
  ~EventPool() {
    for (cudaEvent_t event : free_) cudaEventDestroy(event);
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  /// A free event, or a new one.
  StatusOr<cudaEvent_t> Take() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        const cudaEvent_t event = free_.back();
        free_.pop_back();
        return event;
      }
    }
    cudaEvent_t event = nullptr;
    ZERO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }
  /// Returns `event` for reuse.
  void Give(cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(event);
  }

 private:
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

/// The event a collective records when it completes, and what the collective is (for errors).
/// Shared by the collective's Work and the watchdog; the event goes back to its pool when the
/// last of them lets go.
struct DoneEvent {
  DoneEvent(std::shared_ptr<EventPool> pool, cudaEvent_t event, std::string what)
      : pool(std::move(pool)), event(event), what(std::move(what)) {}
  ~DoneEvent() { pool->Give(event); }
  DoneEvent(const DoneEvent&) = delete;
  DoneEvent& operator=(const DoneEvent&) = delete;

  const std::shared_ptr<EventPool> pool;
  const cudaEvent_t event;
  const std::string what;
};

}  // namespace zero::comm

#endif  // ZERO_COMM_NCCL_NCCL_EVENTS_H_
