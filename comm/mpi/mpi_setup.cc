// Setting MPI up for a communicator.
#include "comm/mpi/mpi_setup.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/status_converters.h"

namespace zero::comm {
namespace {

void FinalizeMpiAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

Status EnsureMpiInitialized() {
  int initialized = 0, finalized = 0;
  ZERO_MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Finalized(&finalized));
  if (finalized) return absl::FailedPreconditionError("MPI has already been finalised");
  if (!initialized) {
    int provided = 0;
    ZERO_MPI_RETURN_IF_ERROR(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    std::atexit(FinalizeMpiAtExit);
  }
  int level = 0;
  ZERO_MPI_RETURN_IF_ERROR(MPI_Query_thread(&level));
  if (level < MPI_THREAD_SERIALIZED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MPI was initialised with thread level ", level, "; ZeroRT's progress thread needs "
        "MPI_THREAD_SERIALIZED or higher: initialise MPI with MPI_Init_thread(..., "
        "MPI_THREAD_MULTIPLE, ...) (mpi4py does by default)"));
  }
  return absl::OkStatus();
}

StatusOr<int> CountRanksOnThisHost(MPI_Comm comm) {
  MPI_Comm host;
  ZERO_MPI_RETURN_IF_ERROR(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
  int ranks = 1;
  const int rc = MPI_Comm_size(host, &ranks);
  MPI_Comm_free(&host);
  ZERO_MPI_RETURN_IF_ERROR(rc);
  return ranks;
}

}  // namespace zero::comm
