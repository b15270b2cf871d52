// Error handling for ZeroRT: absl::Status everywhere, the two propagation macros that the
// abseil shipped by Debian 12 lacks, and the guard's two errors of its own.
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

#endif  // ZERO_STATUS_H_
