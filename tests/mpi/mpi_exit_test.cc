// Programs that end MPI while an MPI communicator is still alive, as a Python process whose
// communicator the garbage collector had not reached when a failed step ended it. The
// communicator's progress thread must stop before MPI_Finalize; before it did, the thread's
// next MPI call after MPI_Finalize crashed the job (a segmentation fault, or "The MPI_Test()
// function was called after MPI_FINALIZE was invoked") and mpirun exited non-zero.
//
//   zero_mpi_exit_test                 the library initialised MPI and finalises it at exit
//   zero_mpi_exit_test host_finalizes  the program initialised MPI and finalises it itself;
//                                      then the communicator fails every collective at once,
//                                      with the reason, and is destroyed without an MPI call
//
// Pass: every rank exits 0 (run_mpi.sh returns mpirun's status).
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "zero/communicator.h"

namespace {

int Fail(const char* what, const zero::Status& status) {
  std::fprintf(stderr, "mpi_exit_test: %s: %s\n", what, std::string(status.message()).c_str());
  return 1;
}

// The status a collective gets once MPI is gone: an error, at once, that says why.
bool SaysMpiWasFinalised(const zero::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         std::string(status.message()).find("MPI was finalised") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  const bool host_finalizes = argc > 1 && std::strcmp(argv[1], "host_finalizes") == 0;
  if (host_finalizes) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  }
  auto comm = zero::comm::CreateMpiCommunicator(nullptr);
  if (!comm.ok()) return Fail("creating the communicator", comm.status());
  // Rank 0 starts an all-reduce that no other rank joins: its progress thread keeps polling it.
  static float value = 1.0f;
  zero::comm::WorkPtr pending;
  if ((*comm)->rank() == 0) {
    pending = (*comm)->AllReduce(&value, &value, 1, zero::DType::kFP32, zero::comm::ReduceOp::kSum);
  }
  if (!host_finalizes) {
    static_cast<void>(pending.release());  // never waited for, never freed
    static_cast<void>(comm->release());    // alive at exit, on every rank
    std::printf("rank exiting with its communicator alive\n");
    return 0;
  }
  MPI_Finalize();
  if (pending != nullptr) {
    const zero::Status in_flight = pending->Wait(/*timeout_s=*/30);
    if (!SaysMpiWasFinalised(in_flight)) return Fail("the collective in flight at MPI_Finalize", in_flight);
  }
  const zero::Status later = (*comm)->Barrier()->Wait(/*timeout_s=*/30);
  if (!SaysMpiWasFinalised(later)) return Fail("a collective after MPI_Finalize", later);
  comm->reset();  // no MPI call: MPI is gone
  std::printf("rank exiting after MPI_Finalize and its communicator's failures\n");
  return 0;
}
