// Staging CUDA device buffers through page-locked host memory.
#include "comm/mpi/device_staging.h"

#include <mpi.h>

#if ZERO_HAVE_CUDA
#include <cuda_runtime.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

#include "base/status_converters.h"

namespace zero::comm {

PinnedBuffer::~PinnedBuffer() {
#if ZERO_HAVE_CUDA
  if (data_ != nullptr) cudaFreeHost(data_);
#endif
}

Status PinnedBuffer::Allocate(size_t bytes) {
#if ZERO_HAVE_CUDA
  ZERO_CUDA_RETURN_IF_ERROR(cudaMallocHost(&data_, bytes > 0 ? bytes : 1));
  return absl::OkStatus();
#else
  (void)bytes;
  return absl::UnimplementedError("staging device buffers needs a build with CUDA");
#endif
}

bool MpiIsCudaAware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

}  // namespace zero::comm
