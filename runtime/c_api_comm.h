// The C ABI's communicator handle, shared by the C ABI files that create or use one.
#ifndef ZERO_RUNTIME_C_API_COMM_H_
#define ZERO_RUNTIME_C_API_COMM_H_

#include <memory>

#include "zero/communicator.h"
#include "zero/zero.h"

/// What a zero_comm* points to: one rank's communicator, shared with the engines created on
/// it (each keeps it alive, so the handle may be destroyed first).
struct zero_comm {
  std::shared_ptr<zero::comm::Communicator> comm;
};

#endif  // ZERO_RUNTIME_C_API_COMM_H_
