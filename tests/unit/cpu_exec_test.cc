// The CPU kernels' thread team per rank: ranks sharing a machine split its cores, a rank its
// launcher bound keeps its own, ZERO_CPU_THREADS overrides both.
#include "kernels/cpu/cpu_exec.h"

#include <gtest/gtest.h>

namespace zero::kernels {
namespace {

TEST(ThreadsPerRankTest, UnboundRanksSplitTheMachine) {
  EXPECT_EQ(ThreadsPerRank(16, 16, 1), 16);
  EXPECT_EQ(ThreadsPerRank(16, 16, 2), 8);
  EXPECT_EQ(ThreadsPerRank(16, 16, 3), 5);
  EXPECT_EQ(ThreadsPerRank(2, 2, 2), 1);
}

TEST(ThreadsPerRankTest, NeverLessThanOneThread) {
  EXPECT_EQ(ThreadsPerRank(2, 2, 3), 1);
  EXPECT_EQ(ThreadsPerRank(2, 2, 64), 1);
  EXPECT_EQ(ThreadsPerRank(0, 2, 1), 1);
  EXPECT_EQ(ThreadsPerRank(4, 4, 0), 4);  // an unknown count is read as one rank
}

TEST(ThreadsPerRankTest, BoundRankUsesItsOwnCores) {
  // mpirun --bind-to core gives each rank one CPU of 16; --map-by ppr:2:node:pe=8 gives 8.
  EXPECT_EQ(ThreadsPerRank(1, 16, 16), 1);
  EXPECT_EQ(ThreadsPerRank(8, 16, 2), 8);
  EXPECT_EQ(ThreadsPerRank(8, 16, 4), 8);
}

TEST(CpuExecFromEnvTest, EnvironmentOverridesTheShare) {
  base::EnvTunables env;
  env.cpu_threads = 3;
  EXPECT_EQ(CpuExecFromEnv(env, 64).threads, 3);
  env.cpu_threads = 0;
  const CpuExec shared = CpuExecFromEnv(env, 1 << 20);
  EXPECT_EQ(shared.threads, 1);  // a million ranks on this host: one thread each
  EXPECT_TRUE(CheckExec(shared).ok());
  EXPECT_GE(CpuExecFromEnv(env, 1).threads, 1);
}

}  // namespace
}  // namespace zero::kernels
