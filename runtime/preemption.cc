// The preemption request: a flag a signal handler sets (the only thing it may safely do).
#include "zero/preemption.h"

#include <signal.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/engine_impl.h"

namespace zero {
namespace {

// Process-wide by necessity: a signal handler reaches only static storage.
volatile std::sig_atomic_t preemption_requested = 0;

extern "C" void RecordPreemption(int) { preemption_requested = 1; }

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

void RequestPreemption() { preemption_requested = 1; }
bool PreemptionSignalled() { return preemption_requested != 0; }
void ClearPreemption() { preemption_requested = 0; }

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
