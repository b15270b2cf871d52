// Converters from backend error codes (CUDA, NCCL, MPI) to absl::Status.
#include "zero/status.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/status_converters.h"

namespace zero {
namespace {

constexpr char kErrorKindUrl[] = "zerort.dev/error_kind";
constexpr char kDuplicateGradient[] = "duplicate_gradient";
constexpr char kUnusedParameters[] = "unused_parameters";

Status WithKind(Status status, const char* kind) {
  status.SetPayload(kErrorKindUrl, absl::Cord(kind));
  return status;
}

bool HasKind(const Status& status, const char* kind) {
  const auto payload = status.GetPayload(kErrorKindUrl);
  return payload.has_value() && *payload == kind;
}

}  // namespace

Status DuplicateGradientError(std::string_view message) {
  return WithKind(absl::AlreadyExistsError(std::string(message)), kDuplicateGradient);
}
Status UnusedParametersError(std::string_view message) {
  return WithKind(absl::FailedPreconditionError(std::string(message)), kUnusedParameters);
}
bool IsDuplicateGradient(const Status& status) { return HasKind(status, kDuplicateGradient); }
bool IsUnusedParameters(const Status& status) { return HasKind(status, kUnusedParameters); }

}  // namespace zero

namespace zero::internal {
namespace {

// Stable values from the CUDA runtime and NCCL ABIs, so this file needs neither header.
constexpr int kCudaErrorMemoryAllocation = 2;
constexpr int kCudaErrorInsufficientDriver = 35;
constexpr int kCudaErrorNoDevice = 100;
constexpr int kNcclSystemError = 2;
constexpr int kNcclInvalidArgument = 4;
constexpr int kNcclInvalidUsage = 5;
constexpr int kNcclRemoteError = 6;

std::string Describe(const char* backend, int code, const char* text, const char* expr,
                     const char* file, int line) {
  return absl::StrCat(file, ":", line, ": ", backend, " error ", code, " (", text ? text : "?",
                      ") in `", expr, "`");
}

}  // namespace

Status CudaError(int code, const char* name, const char* text, const char* expr,
                 const char* file, int line) {
  std::string message =
      Describe("CUDA", code, absl::StrCat(name ? name : "?", ": ", text ? text : "?").c_str(),
               expr, file, line);
  switch (code) {
    case kCudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case kCudaErrorInsufficientDriver:
    case kCudaErrorNoDevice:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

Status NcclError(int code, const char* text, const char* expr, const char* file, int line) {
  std::string message = Describe("NCCL", code, text, expr, file, line);
  switch (code) {
    case kNcclInvalidArgument:
    case kNcclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case kNcclSystemError:
    case kNcclRemoteError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

Status MpiError(int code, const char* text, const char* expr, const char* file, int line) {
  return absl::InternalError(Describe("MPI", code, text, expr, file, line));
}

}  // namespace zero::internal
