// The watchdog thread: polls the watched events every few milliseconds while any is pending.
#include "comm/nccl/nccl_watchdog.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_converters.h"

namespace zero::comm {
namespace {

// How often pending events are polled.
constexpr std::chrono::milliseconds kPollInterval(5);

}  // namespace

NcclWatchdog::NcclWatchdog(int device, std::function<void(const Status&)> fail, std::function<Status()> async_error)
    : device_(device), fail_(std::move(fail)), async_error_(std::move(async_error)) {}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NcclWatchdog::Watch(std::shared_ptr<DoneEvent> done, double timeout_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto wait = std::chrono::duration<double>(timeout_s);
  incoming_.push_back({std::move(done),
                       std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(wait),
                       timeout_s});
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  wake_.notify_all();
}

Status NcclWatchdog::Check(std::vector<Watched>* watched) const {
  const auto now = std::chrono::steady_clock::now();
  Status failure;
  auto complete = [&](const Watched& w) {
    const cudaError_t state = cudaEventQuery(w.done->event);
    if (state == cudaSuccess) return true;
    if (state != cudaErrorNotReady) {
      failure.Update(internal::CudaError(state, cudaGetErrorName(state), cudaGetErrorString(state),
                                         "cudaEventQuery(done)", __FILE__, __LINE__));
    } else if (now > w.deadline) {
      failure.Update(absl::DeadlineExceededError(absl::StrCat(
          w.done->what, " did not complete within ", w.timeout_s,
          " s while the stream waited for it: a peer rank never joined it (the watchdog broke "
          "the group)")));
    }
    return false;
  };
  watched->erase(std::remove_if(watched->begin(), watched->end(), complete), watched->end());
  if (!watched->empty()) failure.Update(async_error_());
  return failure;
}

void NcclWatchdog::Run() {
  cudaSetDevice(device_);
  std::vector<Watched> watched;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (watched.empty() && incoming_.empty()) {
        wake_.wait(lock, [this] { return stop_ || !incoming_.empty(); });
      } else {
        wake_.wait_for(lock, kPollInterval, [this] { return stop_; });
      }
      if (stop_) return;
      for (Watched& w : incoming_) watched.push_back(std::move(w));
      incoming_.clear();
    }
    const Status failure = Check(&watched);
    if (!failure.ok()) {
      fail_(failure);   // aborts the communicator: its kernels end and the events complete
      watched.clear();  // the group is broken; nothing more to watch
    }
  }
}

}  // namespace zero::comm
