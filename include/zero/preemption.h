// Preemption: a batch scheduler (Slurm's `--signal=USR1@120`, Kubernetes, most others) sends
// SIGTERM or SIGUSR1 some time before it stops a job. With the handler installed, the signal
// only records the request; the trainer asks Engine::PreemptionRequested() at each step
// boundary (collective: every rank gets the same answer), saves a checkpoint and exits 0:
//
//   zero::InstallPreemptionHandler();
//   for (...) {
//     ... one training step ...
//     if (*engine->PreemptionRequested()) { engine->SaveCheckpoint(root, tag); return 0; }
//   }
//
// The request is per process: the one piece of process-wide state in the library, because a
// signal handler can reach nothing else.
#ifndef ZERO_PREEMPTION_H_
#define ZERO_PREEMPTION_H_

#include "zero/status.h"

namespace zero {

/// Installs a handler for SIGTERM and SIGUSR1 that records a preemption request instead of
/// ending the process (SA_RESTART: system calls in progress go on). Replaces the handlers the
/// process had for them. kUnavailable if sigaction fails.
Status InstallPreemptionHandler();
/// Records a preemption request, as the signals do (a trainer's own trigger, or a test).
void RequestPreemption();
/// Whether this process has a preemption request (a signal, or RequestPreemption()). Local:
/// Engine::PreemptionRequested() is the answer every rank agrees on.
bool PreemptionSignalled();
/// Forgets the request (after the checkpoint, for a trainer that goes on).
void ClearPreemption();

}  // namespace zero

#endif  // ZERO_PREEMPTION_H_
