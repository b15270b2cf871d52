// Error handling for ZeroRT: absl::Status everywhere, plus the two propagation macros that
// the abseil shipped by Debian 12 lacks, and converters that turn CUDA, NCCL and MPI error
// codes into a Status carrying the failing expression and file:line.
//
// The library never exits or aborts: every failure travels back to the caller as a Status.
#ifndef ZERO_STATUS_H_
#define ZERO_STATUS_H_

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zero {

using absl::Status;
using absl::StatusOr;

/// A gradient arrived twice for one param in one iteration (C ABI code 100). Carried as
/// kAlreadyExists with a payload, so it survives absl::Status and can be told apart.
Status DuplicateGradientError(std::string_view message);
/// Params got no gradient in an iteration (C ABI code 101): kFailedPrecondition + payload.
Status UnusedParametersError(std::string_view message);
/// True for statuses made by DuplicateGradientError / UnusedParametersError.
bool IsDuplicateGradient(const Status& status);
bool IsUnusedParameters(const Status& status);

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

#define ZERO_STATUS_CONCAT_INNER_(a, b) a##b
#define ZERO_STATUS_CONCAT_(a, b) ZERO_STATUS_CONCAT_INNER_(a, b)

/// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if not OK.
#define ZERO_RETURN_IF_ERROR(expr)                                   \
  do {                                                               \
    ::absl::Status zero_status_ = (expr);                            \
    if (!zero_status_.ok()) return zero_status_;                     \
  } while (0)

/// `ZERO_ASSIGN_OR_RETURN(lhs, rexpr)`: evaluates `rexpr` (an absl::StatusOr<T>); on error
/// returns its status, otherwise moves the value into `lhs` (which may be a declaration).
#define ZERO_ASSIGN_OR_RETURN(lhs, rexpr) \
  ZERO_ASSIGN_OR_RETURN_IMPL_(ZERO_STATUS_CONCAT_(zero_statusor_, __LINE__), lhs, rexpr)
#define ZERO_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()

/// Returns a Status from the enclosing function when a CUDA runtime call fails.
/// Usable only where <cuda_runtime.h> is included.
#define ZERO_CUDA_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                    \
    cudaError_t zero_cuda_rc_ = (expr);                                                   \
    if (zero_cuda_rc_ != cudaSuccess) {                                                   \
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

#endif  // ZERO_STATUS_H_
