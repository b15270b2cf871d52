// main() for GoogleTest binaries run under mpirun: every rank runs every test; the process
// exits non-zero on every rank if any rank failed, and only rank 0 prints the full report
// (other ranks print their failures).
//
// Built twice: with ZERO_TEST_INIT_MPI the program initialises MPI itself (as a host program
// like mpi4py would) before ZeroRT sees it; without it ZeroRT initialises and finalises MPI.
#include <gtest/gtest.h>
#include <mpi.h>

#include "zero/communicator.h"

int main(int argc, char** argv) {
#if ZERO_TEST_INIT_MPI
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
#endif
  ::testing::InitGoogleTest(&argc, argv);
  auto world = zero::comm::CreateMpiCommunicator(nullptr);
  if (!world.ok()) {
    fprintf(stderr, "cannot create the MPI communicator: %s\n", world.status().ToString().c_str());
    return 2;
  }
  if ((*world)->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  float failed = RUN_ALL_TESTS() != 0 ? 1.0f : 0.0f;
  const zero::Status agreed =
      (*world)->AllReduce(&failed, &failed, 1, zero::DType::kFP32, zero::comm::ReduceOp::kMax)->Wait(60);
  if (!agreed.ok()) fprintf(stderr, "rank %d: %s\n", (*world)->rank(), agreed.ToString().c_str());
  const int rc = (!agreed.ok() || failed != 0.0f) ? 1 : 0;
  world->reset();
#if ZERO_TEST_INIT_MPI
  MPI_Finalize();
#endif
  return rc;
}
