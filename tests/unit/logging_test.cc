// Logging: level filtering, rank prefix, lazy evaluation of disabled lines.
#include "base/logging.h"

#include <gtest/gtest.h>

namespace zero::base {
namespace {

int Counted(int* calls) {
  ++*calls;
  return 7;
}

TEST(Logging, FiltersByLevelAndPrefixesTheRank) {
  Logger logger(LogLevel::kInfo, 3);
  ::testing::internal::CaptureStderr();
  ZERO_LOG(logger, kInfo) << "bucket " << 2 << " launched";
  ZERO_LOG(logger, kDetail) << "not shown";
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "[zero r3 INFO] bucket 2 launched\n");
}

TEST(Logging, NoRankBeforeRanksExist) {
  Logger logger(LogLevel::kWarn);
  ::testing::internal::CaptureStderr();
  ZERO_LOG(logger, kWarn) << "careful";
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "[zero WARN] careful\n");
}

TEST(Logging, DisabledLinesDoNotEvaluateOperands) {
  Logger logger(LogLevel::kWarn);
  int calls = 0;
  ZERO_LOG(logger, kDetail) << Counted(&calls);
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace zero::base
