// Setting MPI up for a communicator.
#include "comm/mpi/mpi_setup.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/env.h"
#include "base/status_converters.h"
#include "zero/communicator.h"

namespace zero::comm {
namespace {

void FinalizeMpiAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// The progress threads to stop before MPI_Finalize. Process-wide, as MPI itself is: one MPI
// library, initialised and finalised once per process.
struct ProgressThreads {
  std::mutex mutex;
  // In registration order, which is the same on every rank (communicators are created
  // collectively): a stop may agree with the peers (MpiCommunicator::StopBeforeFinalize).
  std::vector<std::pair<const void*, std::function<void()>>> stops;
  bool hooked = false;      // the MPI_COMM_SELF attribute is set
  bool finalizing = false;  // MPI_Finalize has begun
};

ProgressThreads& Registry() {
  static ProgressThreads* registry = new ProgressThreads;  // never destroyed: used at exit
  return *registry;
}

// MPI_Finalize frees MPI_COMM_SELF's attributes first: stop every progress thread then.
// Under the lock, so that a communicator being destroyed meanwhile waits in
// UnregisterProgressThread instead of going while its thread is stopped.
int StopProgressThreadsBeforeFinalize(MPI_Comm, int, void*, void*) {
  std::lock_guard<std::mutex> lock(Registry().mutex);
  Registry().finalizing = true;
  for (auto& [owner, stop] : Registry().stops) stop();
  Registry().stops.clear();
  return MPI_SUCCESS;
}

}  // namespace

Status RegisterProgressThread(const void* owner, std::function<void()> stop) {
  ProgressThreads& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (!registry.hooked) {
    int keyval = MPI_KEYVAL_INVALID;
    ZERO_MPI_RETURN_IF_ERROR(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN,
                                                    StopProgressThreadsBeforeFinalize, &keyval, nullptr));
    ZERO_MPI_RETURN_IF_ERROR(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr));
    registry.hooked = true;
  }
  registry.stops.emplace_back(owner, std::move(stop));
  return absl::OkStatus();
}

bool UnregisterProgressThread(const void* owner) {
  ProgressThreads& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.stops.erase(std::remove_if(registry.stops.begin(), registry.stops.end(),
                                      [owner](const auto& entry) { return entry.first == owner; }),
                       registry.stops.end());
  return registry.finalizing;
}

Status EnsureMpiInitialized() {
  int initialized = 0, finalized = 0;
  ZERO_MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Finalized(&finalized));
  if (finalized) return absl::FailedPreconditionError("MPI has already been finalised");
  if (!initialized) {
    int provided = 0;
    ZERO_MPI_RETURN_IF_ERROR(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    std::atexit(FinalizeMpiAtExit);
    // OpenMPI reports a failed non-blocking collective's request (MPI_Testall) on
    // MPI_COMM_WORLD, whose default handler aborts the job: an error then reaches the caller
    // instead. A host program that initialised MPI keeps its own handler.
    ZERO_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
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

Status RequireMpiLaunch() {
  int size = 0;
  ZERO_MPI_RETURN_IF_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &size));
  const std::optional<base::LauncherPlace> place = base::ReadLauncherPlace();
  if (size != 1 || !place.has_value() || place->world <= 1) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this process was started as rank ", place->rank, " of ", place->world, " by a launcher that is not MPI's (RANK=",
      place->rank, ", WORLD_SIZE=", place->world, ": torchrun, the deepspeed launcher or accelerate launch), but MPI "
      "sees it alone, so each process would train on its own. ZeroRT's ranks are MPI's here: launch with `mpirun -np ",
      place->world, " python3 ...` (or srun --mpi=pmix under Slurm), or from PyTorch take torch.distributed's ranks "
      "(zerort.torch.initialize without comm, or comm=zerort.torch.torch_communicator()); for a single process, "
      "unset WORLD_SIZE"));
}

Status AbortMpiJob(int exit_code) {
  int initialized = 0, finalized = 0;
  ZERO_MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Finalized(&finalized));
  if (!initialized || finalized) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MPI is ", initialized ? "already finalised" : "not initialised", ": there is no MPI job to end"));
  }
  ZERO_MPI_RETURN_IF_ERROR(MPI_Abort(MPI_COMM_WORLD, exit_code));
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
