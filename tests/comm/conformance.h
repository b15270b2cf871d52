// The communicator conformance suite: every collective, dtype, reduction and odd size, in
// place and out of place, checked against a float64 reference (integer types exactly, 64-bit
// patterns bit for bit). Written per rank so the same code runs on in-process ranks (one
// thread each) and under mpirun (one process each).
#ifndef ZERO_TESTS_COMM_CONFORMANCE_H_
#define ZERO_TESTS_COMM_CONFORMANCE_H_

#include <cstdint>
#include <vector>

#include "zero/communicator.h"
#include "zero/device.h"

namespace zero::testing {

/// Element counts per rank every backend is checked with.
inline const std::vector<int64_t>& ConformanceSizes() {
  static const std::vector<int64_t> sizes = {1, 7, 1000003};
  return sizes;
}

/// Runs the whole suite on this rank; every rank of the group must call it. Returns the first
/// failure (naming collective, dtype, size, element, got and expected), or OK.
/// `pairwise_rounding`: the backend rounds 16-bit sums after each combining step (MPI's user
/// operations) rather than once; the tolerance widens accordingly.
/// `placement` kDevice runs every collective on CUDA device buffers (inputs uploaded, results
/// downloaded and checked on the host).
Status RunConformanceSuite(comm::Communicator& comm, bool pairwise_rounding,
                           Placement placement = Placement::kHost);

}  // namespace zero::testing

#endif  // ZERO_TESTS_COMM_CONFORMANCE_H_
