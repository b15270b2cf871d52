// Converters that turn CUDA, NCCL and MPI error codes into a Status carrying the failing
// expression and file:line, and the macros that return it (internal: not installed).
#ifndef ZERO_BASE_STATUS_CONVERTERS_H_
#define ZERO_BASE_STATUS_CONVERTERS_H_

#include "zero/status.h"

namespace zero {
namespace internal {

/// Builds the Status for a failed CUDA runtime call. `code` is the cudaError_t value; `name`
/// and `text` come from cudaGetErrorName/cudaGetErrorString. Out-of-memory maps to
/// kResourceExhausted, "no device"/"no driver" to kUnavailable, everything else to kInternal.
Status CudaError(int code, const char* name, const char* text, const char* expr,
                 const char* file, int line);

/// Builds the Status for a failed NCCL call (`code` is the ncclResult_t value, `text` from
/// ncclGetErrorString). Invalid argument/usage map to kInvalidArgument, system/remote errors to
/// kUnavailable, the rest to kInternal.
Status NcclError(int code, const char* text, const char* expr, const char* file, int line);

/// Builds the Status for a failed MPI call (`code` is the MPI error code, `text` from
/// MPI_Error_string). Always kInternal: MPI's error classes are not portable enough to map.
Status MpiError(int code, const char* text, const char* expr, const char* file, int line);

}  // namespace internal
}  // namespace zero

/// Returns a Status from the enclosing function when a CUDA runtime call fails, first clearing
/// the thread's last CUDA error (the runtime keeps a non-sticky one until read, and a later,
/// unrelated launch check, ours or PyTorch's, sharing the runtime would report it again).
/// Usable only where <cuda_runtime.h> is included.
#define ZERO_CUDA_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                    \
    cudaError_t zero_cuda_rc_ = (expr);                                                   \
    if (zero_cuda_rc_ != cudaSuccess) {                                                   \
      (void)cudaGetLastError();                                                           \
      return ::zero::internal::CudaError(static_cast<int>(zero_cuda_rc_),                 \
                                         cudaGetErrorName(zero_cuda_rc_),                 \
                                         cudaGetErrorString(zero_cuda_rc_), #expr,        \
                                         __FILE__, __LINE__);                             \
    }                                                                                     \
  } while (0)

/// Returns a Status from the enclosing function when an NCCL call fails.
/// Usable only where <nccl.h> is included.
#define ZERO_NCCL_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                    \
    ncclResult_t zero_nccl_rc_ = (expr);                                                  \
    if (zero_nccl_rc_ != ncclSuccess) {                                                   \
      return ::zero::internal::NcclError(static_cast<int>(zero_nccl_rc_),                 \
                                         ncclGetErrorString(zero_nccl_rc_), #expr,        \
                                         __FILE__, __LINE__);                             \
    }                                                                                     \
  } while (0)

/// Returns a Status from the enclosing function when an MPI call fails (the communicator
/// must use MPI_ERRORS_RETURN). Usable only where <mpi.h> is included.
#define ZERO_MPI_RETURN_IF_ERROR(expr)                                                    \
  do {                                                                                    \
    int zero_mpi_rc_ = (expr);                                                            \
    if (zero_mpi_rc_ != MPI_SUCCESS) {                                                    \
      char zero_mpi_text_[MPI_MAX_ERROR_STRING] = {0};                                    \
      int zero_mpi_len_ = 0;                                                              \
      MPI_Error_string(zero_mpi_rc_, zero_mpi_text_, &zero_mpi_len_);                     \
      return ::zero::internal::MpiError(zero_mpi_rc_, zero_mpi_text_, #expr, __FILE__,    \
                                        __LINE__);                                        \
    }                                                                                     \
  } while (0)

#endif  // ZERO_BASE_STATUS_CONVERTERS_H_
