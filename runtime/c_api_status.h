// The C ABI's error reporting, shared by its source files: each call turns a Status (or an
// exception) into a zero_status and keeps the message for zero_last_error() on the calling
// thread.
#ifndef ZERO_RUNTIME_C_API_STATUS_H_
#define ZERO_RUNTIME_C_API_STATUS_H_

#include <string>

#include "zero/status.h"
#include "zero/zero.h"

namespace zero::c_api {

/// The calling thread's message of its last failed call.
std::string& LastError();

/// `status` as a zero_status; a failure's message is kept for zero_last_error().
zero_status Report(const Status& status);

/// ZERO_INVALID_ARGUMENT "`call`: `what` is NULL".
zero_status NullArgument(const char* call, const char* what);

/// The exception being handled as a zero_status: an allocation that fails is
/// ZERO_RESOURCE_EXHAUSTED, anything else ZERO_INTERNAL, both with a message naming `call`.
zero_status ReportCurrentException(const char* call);

}  // namespace zero::c_api

/// Returns ZERO_INVALID_ARGUMENT from the calling C ABI function when `pointer` is NULL.
#define ZERO_C_REQUIRE(pointer, call) \
  if ((pointer) == nullptr) return ::zero::c_api::NullArgument(call, #pointer)

/// Ends a C ABI function written as a function-try-block, `zero_status f(...) try { ... }`:
/// no exception leaves the C ABI (it would end the caller's process).
#define ZERO_C_CATCH(call) \
  catch (...) {            \
    return ::zero::c_api::ReportCurrentException(call); \
  }

#endif  // ZERO_RUNTIME_C_API_STATUS_H_
