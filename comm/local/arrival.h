// One rank's arrival at a collective of the local backend (internal to comm/local).
#ifndef ZERO_COMM_LOCAL_ARRIVAL_H_
#define ZERO_COMM_LOCAL_ARRIVAL_H_

#include <optional>
#include <vector>

#include "zero/communicator.h"

namespace zero::comm {

struct Arrival {
  CollectiveSignature signature;
  const void* send = nullptr;
  void* recv = nullptr;
  bool on_device = false;  // the buffers are CUDA device memory
  Status invalid;          // this rank's own arguments were bad: the whole collective fails
};

using Arrivals = std::vector<std::optional<Arrival>>;

/// Moves the data of a complete, consistent collective whose buffers are CUDA device memory
/// (every rank's on one device or peer-accessible ones): device copies plus a reduction kernel
/// that sums in rank order in fp32 and rounds once, like the host path. kUnimplemented in
/// builds without CUDA.
Status ExecuteOnDevice(const Arrivals& arrivals);

}  // namespace zero::comm

#endif  // ZERO_COMM_LOCAL_ARRIVAL_H_
