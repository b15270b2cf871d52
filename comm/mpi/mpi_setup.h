// Setting MPI up for a communicator (internal to comm/mpi): initialisation at the thread level
// the progress thread needs, and how many ranks share this machine.
#ifndef ZERO_COMM_MPI_MPI_SETUP_H_
#define ZERO_COMM_MPI_MPI_SETUP_H_

#include <mpi.h>

#include <functional>

#include "zero/status.h"

namespace zero::comm {

/// Initialises MPI when the host program has not (and finalises it at exit), and checks that
/// the thread level is MPI_THREAD_SERIALIZED or higher.
Status EnsureMpiInitialized();

/// kFailedPrecondition when MPI_COMM_WORLD holds this process alone while a launcher that is
/// not MPI's started it as one of several (base::ReadLauncherPlace: torchrun, the deepspeed
/// launcher): each process would train on its own, silently. Call after EnsureMpiInitialized.
Status RequireMpiLaunch();

/// Progress threads make MPI calls on their own, so each must stop before MPI_Finalize,
/// whoever calls it (this library at exit, the host program, mpi4py at exit). A live
/// communicator registers its `stop` (which joins its thread; it may then make MPI calls of
/// its own, as MPI still works there) under `owner`; MPI_Finalize runs every registered `stop`
/// first, in registration order, through the delete callback of an attribute on MPI_COMM_SELF
/// (the MPI standard frees MPI_COMM_SELF's attributes first thing in MPI_Finalize). Call after
/// EnsureMpiInitialized.
Status RegisterProgressThread(const void* owner, std::function<void()> stop);
/// Before `owner` goes. True when MPI_Finalize has begun (its `stop` has run or is not needed):
/// the owner must then make no MPI call, as MPI is being torn down, perhaps by another thread.
bool UnregisterProgressThread(const void* owner);

/// How many ranks of `comm` share this machine's memory (and cores): collective.
StatusOr<int> CountRanksOnThisHost(MPI_Comm comm);

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_MPI_SETUP_H_
