// Environment tunables: defaults, valid values, and errors that name the variable.
#include "base/env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace zero::base {
namespace {

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
  ASSERT_TRUE(env.ok());
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
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->log_level, LogLevel::kDetail);
  EXPECT_EQ(env->cpu_isa_cap, CpuIsa::kAvx2);
  EXPECT_EQ(env->cpu_threads, 3);
  EXPECT_EQ(env->mpi_reduce_scatter, "ring");
  EXPECT_EQ(env->mpi_all_reduce, "direct");
}

TEST_F(EnvTest, BadValuesNameTheVariable) {
  setenv("ZERO_DEBUG", "LOUD", 1);
  Status s = ReadEnvTunables().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("ZERO_DEBUG"), std::string::npos);
  Clear();
  setenv("ZERO_CPU_ISA", "sse9", 1);
  s = ReadEnvTunables().status();
  EXPECT_NE(s.message().find("ZERO_CPU_ISA"), std::string::npos);
  Clear();
  setenv("ZERO_CPU_THREADS", "-2", 1);
  s = ReadEnvTunables().status();
  EXPECT_NE(s.message().find("ZERO_CPU_THREADS"), std::string::npos);
  Clear();
  setenv("ZERO_MPI_REDUCE_SCATTER", "tree", 1);
  s = ReadEnvTunables().status();
  EXPECT_NE(s.message().find("ZERO_MPI_REDUCE_SCATTER=tree"), std::string::npos);
  Clear();
  setenv("ZERO_MPI_ALL_REDUCE", "ring", 1);
  s = ReadEnvTunables().status();
  EXPECT_NE(s.message().find("ZERO_MPI_ALL_REDUCE=ring"), std::string::npos);
}

TEST(CpuIsa, DetectionIsConsistentWithNames) {
  const CpuIsa isa = DetectCpuIsa();
  EXPECT_EQ(*ParseCpuIsa(CpuIsaName(isa)), isa);
  EXPECT_FALSE(ParseCpuIsa("neon").ok());
}

}  // namespace
}  // namespace zero::base
