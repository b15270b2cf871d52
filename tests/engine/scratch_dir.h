// A fresh directory path for the running test: under gtest's TempDir, named after `prefix`,
// the process and the test, removed if a previous run left it.
#ifndef ZERO_TESTS_ENGINE_SCRATCH_DIR_H_
#define ZERO_TESTS_ENGINE_SCRATCH_DIR_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace zero::testing {

inline std::string ScratchDir(const std::string& prefix) {
  const std::string dir = ::testing::TempDir() + prefix + "-" + std::to_string(::getpid()) + "-" +
                          ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace zero::testing

#endif  // ZERO_TESTS_ENGINE_SCRATCH_DIR_H_
