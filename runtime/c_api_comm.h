// The C ABI's communicator handle, shared by the C ABI files that create or use one.
#ifndef ZERO_RUNTIME_C_API_COMM_H_
#define ZERO_RUNTIME_C_API_COMM_H_

#include <memory>

#include "zero/communicator.h"
#include "zero/zero.h"

/// What a zero_comm* points to: one rank's communicator.
struct zero_comm {
  std::unique_ptr<zero::comm::Communicator> comm;
};

#endif  // ZERO_RUNTIME_C_API_COMM_H_
