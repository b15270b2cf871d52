// A program that exits while an MPI communicator is still alive with a collective in flight,
// as a Python process whose communicator the garbage collector had not reached when a failed
// step ended it. The library initialised MPI, so it finalises MPI at exit; the communicator's
// progress thread must stop before that MPI_Finalize. Before it did, the thread's next MPI_Test
// aborted the job ("The MPI_Test() function was called after MPI_FINALIZE was invoked") and
// mpirun exited non-zero. Pass: every rank exits 0 (run_mpi.sh returns mpirun's status).
#include <cstdio>
#include <memory>

#include "zero/communicator.h"

int main() {
  auto comm = zero::comm::CreateMpiCommunicator(nullptr);
  if (!comm.ok()) {
    std::fprintf(stderr, "mpi_exit_test: %s\n", std::string(comm.status().message()).c_str());
    return 1;
  }
  // Rank 0 starts an all-reduce that no other rank joins: its progress thread keeps polling it.
  static float value = 1.0f;
  if ((*comm)->rank() == 0) {
    zero::comm::WorkPtr pending = (*comm)->AllReduce(&value, &value, 1, zero::DType::kFP32,
                                                     zero::comm::ReduceOp::kSum);
    static_cast<void>(pending.release());  // never waited for, never freed
  }
  static_cast<void>(comm->release());  // alive at exit, on every rank
  std::printf("rank exiting with its communicator alive\n");
  return 0;
}
