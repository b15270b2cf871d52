// Staging CUDA device buffers through page-locked host memory, for an MPI that cannot take
// device pointers (internal to comm/mpi).
#ifndef ZERO_COMM_MPI_DEVICE_STAGING_H_
#define ZERO_COMM_MPI_DEVICE_STAGING_H_

#include <cstddef>

#include "zero/status.h"

namespace zero::comm {

/// Page-locked host memory for one staged buffer (freed with it). kUnimplemented in builds
/// without CUDA.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();
  Status Allocate(size_t bytes);
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
};

/// True when this MPI reports that it accepts CUDA device pointers.
bool MpiIsCudaAware();

}  // namespace zero::comm

#endif  // ZERO_COMM_MPI_DEVICE_STAGING_H_
