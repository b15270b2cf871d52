// Setting MPI up for a communicator (internal to comm/mpi): initialisation at the thread level
// the progress thread needs, and how many ranks share this machine.
#ifndef ZERO_COMM_MPI_MPI_SETUP_H_
#define ZERO_COMM_MPI_MPI_SETUP_H_

#include <mpi.h>

#include "zero/status.h"

namespace zero::comm {

/// Initialises MPI when the host program has not (and finalises it at exit), and checks that
/// the thread level is MPI_THREAD_SERIALIZED or higher.
Status EnsureMpiInitialized();

/// How many ranks of `comm` share this machine's memory (and cores): collective.
StatusOr<int> CountRanksOnThisHost(MPI_Comm comm);

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_MPI_SETUP_H_
