// The preemption request: a flag a signal handler sets (the only thing it may safely do).
#include "zero/preemption.h"

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/engine_impl.h"

namespace zero {
namespace {

// Process-wide by necessity: a signal handler reaches only static storage. A lock-free atomic
// is safe in a handler and between the rank threads.
std::atomic<int> preemption_requested{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void RecordPreemption(int) { preemption_requested.store(1, std::memory_order_relaxed); }

}  // namespace

Status InstallPreemptionHandler() {
  struct sigaction action {};
  action.sa_handler = RecordPreemption;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (const int signal : {SIGTERM, SIGUSR1}) {
    if (::sigaction(signal, &action, nullptr) != 0) {
      return absl::UnavailableError(absl::StrCat("InstallPreemptionHandler: sigaction(", strsignal(signal),
                                                 "): ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

void RequestPreemption() { preemption_requested.store(1, std::memory_order_relaxed); }
bool PreemptionSignalled() { return preemption_requested.load(std::memory_order_relaxed) != 0; }
void ClearPreemption() { preemption_requested.store(0, std::memory_order_relaxed); }

namespace runtime {

StatusOr<bool> EngineImpl::PreemptionRequested() {
  ZERO_RETURN_IF_ERROR(RequireHealthyGroup("PreemptionRequested"));
  ZERO_RETURN_IF_ERROR(RequirePhase(Phase::kIdle, "PreemptionRequested"));
  float requested = PreemptionSignalled() ? 1.0f : 0.0f;
  ZERO_RETURN_IF_ERROR(host_.AllReduce(&requested, 1, comm::ReduceOp::kMax));
  return requested > 0;
}

}  // namespace runtime
}  // namespace zero
