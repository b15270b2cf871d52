// The C ABI's error reporting (c_api_status.h).
#include "runtime/c_api_status.h"

#include <exception>
#include <new>
#include <string>

#include "absl/strings/str_cat.h"

namespace zero::c_api {

std::string& LastError() {
  thread_local std::string last_error;
  return last_error;
}

zero_status Report(const Status& status) {
  if (status.ok()) return ZERO_OK;
  LastError() = std::string(status.message());
  if (IsDuplicateGradient(status)) return ZERO_DUPLICATE_GRADIENT;
  if (IsUnusedParameters(status)) return ZERO_UNUSED_PARAMETERS;
  return static_cast<zero_status>(static_cast<int>(status.code()));
}

zero_status NullArgument(const char* call, const char* what) {
  return Report(absl::InvalidArgumentError(absl::StrCat(call, ": ", what, " is NULL")));
}

// The message itself allocates: when that fails too, the status stands with an empty message.
zero_status ReportCurrentException(const char* call) {
  zero_status code = ZERO_INTERNAL;
  std::string& last_error = LastError();
  try {
    try {
      throw;
    } catch (const std::bad_alloc&) {
      code = ZERO_RESOURCE_EXHAUSTED;
      last_error.clear();
      last_error = absl::StrCat(call, ": out of host memory (an allocation inside this call failed): free memory "
                                "or ask for less");
    } catch (const std::exception& error) {
      last_error = absl::StrCat(call, ": ", error.what());
    } catch (...) {
      last_error = absl::StrCat(call, ": an unknown exception");
    }
  } catch (...) {
    last_error.clear();
  }
  return code;
}

}  // namespace zero::c_api

extern "C" const char* zero_last_error(void) { return zero::c_api::LastError().c_str(); }
