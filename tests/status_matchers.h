// gMock matchers for Status and StatusOr (as abseil's status_matchers), so a failed check
// prints the status itself, and a check over every rank's status names the failing element:
//
//   EXPECT_THAT(engine.Step(), IsOk());
//   EXPECT_THAT(status, StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 3")));
//   ASSERT_THAT(RunOnRanks(3, body), Each(IsOk()));
#ifndef ZERO_TESTS_STATUS_MATCHERS_H_
#define ZERO_TESTS_STATUS_MATCHERS_H_

#include <gmock/gmock.h>

#include <string>

#include "zero/status.h"

namespace zero::testing {

inline const Status& StatusOf(const Status& status) { return status; }
template <typename T>
const Status& StatusOf(const StatusOr<T>& status_or) {
  return status_or.status();
}

/// Matches an OK Status, or a StatusOr holding a value.
MATCHER(IsOk, negation ? "is not OK" : "is OK") {
  const Status& status = StatusOf(arg);
  if (!status.ok()) *result_listener << "whose status is " << status;
  return status.ok();
}

/// Matches a Status (or StatusOr) with `code` whose message matches `message` (a string
/// matcher, e.g. HasSubstr("bucket 2"); any message when omitted).
MATCHER_P2(StatusIs, code, message,
           std::string("has code ") + absl::StatusCodeToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message)) {
  const Status& status = StatusOf(arg);
  *result_listener << "whose status is " << status;
  return status.code() == code &&
         ::testing::Matches(::testing::SafeMatcherCast<const std::string&>(message))(
             std::string(status.message()));
}

/// StatusIs with any message.
inline auto StatusIs(absl::StatusCode code) { return StatusIs(code, ::testing::A<std::string>()); }

}  // namespace zero::testing

#endif  // ZERO_TESTS_STATUS_MATCHERS_H_
