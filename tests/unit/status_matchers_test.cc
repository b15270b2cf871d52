// The test suites' Status matchers: they accept what they promise and nothing else, and say
// which status they saw.
#include "tests/status_matchers.h"

#include <gtest/gtest.h>

#include <vector>

namespace zero::testing {
namespace {

using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(StatusMatchers, IsOkMatchesOkStatusesAndValues) {
  EXPECT_THAT(Status(), IsOk());
  EXPECT_THAT(StatusOr<int>(3), IsOk());
  EXPECT_THAT(absl::AbortedError("rank 2 failed"), Not(IsOk()));
  EXPECT_THAT(StatusOr<int>(absl::NotFoundError("x")), Not(IsOk()));
  EXPECT_THAT((std::vector<Status>{Status(), Status()}), Each(IsOk()));
  EXPECT_THAT((std::vector<Status>{Status(), absl::InternalError("y")}), Not(Each(IsOk())));
}

TEST(StatusMatchers, StatusIsChecksCodeAndMessage) {
  const Status aborted = absl::AbortedError("rank 3 could not read its part");
  EXPECT_THAT(aborted, StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(aborted, StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 3")));
  EXPECT_THAT(aborted, Not(StatusIs(absl::StatusCode::kAborted, HasSubstr("rank 4"))));
  EXPECT_THAT(aborted, Not(StatusIs(absl::StatusCode::kDataLoss)));
  EXPECT_THAT(StatusOr<int>(absl::DataLossError("bad")), StatusIs(absl::StatusCode::kDataLoss, "bad"));
}

TEST(StatusMatchers, AFailureShowsTheStatus) {
  ::testing::StringMatchResultListener listener;
  EXPECT_FALSE(::testing::ExplainMatchResult(IsOk(), absl::AbortedError("peer gone"), &listener));
  EXPECT_THAT(listener.str(), HasSubstr("peer gone"));
}

}  // namespace
}  // namespace zero::testing
