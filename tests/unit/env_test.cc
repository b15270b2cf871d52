// Environment tunables: defaults, valid values, and errors that name the variable.
#include "base/env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "tests/status_matchers.h"

namespace zero::base {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using zero::testing::IsOk;
using zero::testing::StatusIs;

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override { Clear(); }
  void TearDown() override { Clear(); }
  static void Clear() {
    unsetenv("ZERO_DEBUG");
    unsetenv("ZERO_CPU_ISA");
    unsetenv("ZERO_CPU_THREADS");
    unsetenv("ZERO_MPI_REDUCE_SCATTER");
    unsetenv("ZERO_MPI_ALL_REDUCE");
  }
};

TEST_F(EnvTest, DefaultsWhenUnset) {
  auto env = ReadEnvTunables();
  ASSERT_THAT(env, IsOk());
  EXPECT_EQ(env->log_level, LogLevel::kWarn);
  EXPECT_FALSE(env->cpu_isa_cap.has_value());
  EXPECT_EQ(env->cpu_threads, 0);
  EXPECT_EQ(env->mpi_reduce_scatter, "auto");
  EXPECT_EQ(env->mpi_all_reduce, "auto");
}

TEST_F(EnvTest, ParsesValues) {
  setenv("ZERO_DEBUG", "detail", 1);
  setenv("ZERO_CPU_ISA", "avx2", 1);
  setenv("ZERO_CPU_THREADS", "3", 1);
  setenv("ZERO_MPI_REDUCE_SCATTER", "Ring", 1);
  setenv("ZERO_MPI_ALL_REDUCE", "Direct", 1);
  auto env = ReadEnvTunables();
  ASSERT_THAT(env, IsOk());
  EXPECT_EQ(env->log_level, LogLevel::kDetail);
  EXPECT_EQ(env->cpu_isa_cap, CpuIsa::kAvx2);
  EXPECT_EQ(env->cpu_threads, 3);
  EXPECT_EQ(env->mpi_reduce_scatter, "ring");
  EXPECT_EQ(env->mpi_all_reduce, "direct");
}

TEST_F(EnvTest, BadValuesNameTheVariable) {
  setenv("ZERO_DEBUG", "LOUD", 1);
  EXPECT_THAT(ReadEnvTunables(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ZERO_DEBUG")));
  Clear();
  setenv("ZERO_CPU_ISA", "sse9", 1);
  EXPECT_THAT(std::string(ReadEnvTunables().status().message()), HasSubstr("ZERO_CPU_ISA"));
  Clear();
  setenv("ZERO_CPU_THREADS", "-2", 1);
  EXPECT_THAT(std::string(ReadEnvTunables().status().message()), HasSubstr("ZERO_CPU_THREADS"));
  Clear();
  setenv("ZERO_MPI_REDUCE_SCATTER", "tree", 1);
  EXPECT_THAT(std::string(ReadEnvTunables().status().message()), HasSubstr("ZERO_MPI_REDUCE_SCATTER=tree"));
  Clear();
  setenv("ZERO_MPI_ALL_REDUCE", "ring", 1);
  EXPECT_THAT(std::string(ReadEnvTunables().status().message()), HasSubstr("ZERO_MPI_ALL_REDUCE=ring"));
}

TEST(CpuIsa, DetectionIsConsistentWithNames) {
  const CpuIsa isa = DetectCpuIsa();
  EXPECT_EQ(*ParseCpuIsa(CpuIsaName(isa)), isa);
  EXPECT_THAT(ParseCpuIsa("neon"), Not(IsOk()));
}

}  // namespace
}  // namespace zero::base
