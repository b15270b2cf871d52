// Status macros and the CUDA/NCCL/MPI error converters.
#include "zero/status.h"

#include <gtest/gtest.h>

#include "base/status_converters.h"

namespace zero {
namespace {

Status FailsWith(absl::StatusCode code) { return Status(code, "inner failure"); }

Status Propagates(absl::StatusCode code, bool* reached_end) {
  ZERO_RETURN_IF_ERROR(FailsWith(code));
  *reached_end = true;
  return absl::OkStatus();
}

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  ZERO_ASSIGN_OR_RETURN(int half, Half(x));
  ZERO_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

TEST(StatusMacros, ReturnIfErrorPropagatesAndPassesOk) {
  bool reached = false;
  EXPECT_EQ(Propagates(absl::StatusCode::kNotFound, &reached).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(reached);
  EXPECT_TRUE(Propagates(absl::StatusCode::kOk, &reached).ok());
  EXPECT_TRUE(reached);
}

TEST(StatusMacros, AssignOrReturnUnwrapsOrPropagates) {
  EXPECT_EQ(*Quarter(12), 3);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Quarter(7).status().message(), "odd");
}

TEST(BackendErrors, CudaCodesMapToStatusCodesWithLocation) {
  Status oom = internal::CudaError(2, "cudaErrorMemoryAllocation", "out of memory",
                                   "cudaMalloc(&p, n)", "alloc.cc", 42);
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("alloc.cc:42"), std::string::npos);
  EXPECT_NE(oom.message().find("cudaMalloc(&p, n)"), std::string::npos);
  EXPECT_NE(oom.message().find("cudaErrorMemoryAllocation"), std::string::npos);
  EXPECT_EQ(internal::CudaError(35, "n", "t", "e", "f", 1).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(internal::CudaError(700, "n", "t", "e", "f", 1).code(), absl::StatusCode::kInternal);
}

TEST(BackendErrors, NcclAndMpiCodes) {
  EXPECT_EQ(internal::NcclError(4, "invalid argument", "ncclAllReduce", "f", 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(internal::NcclError(6, "remote", "e", "f", 1).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(internal::NcclError(3, "internal", "e", "f", 1).code(), absl::StatusCode::kInternal);
  Status mpi = internal::MpiError(5, "MPI_ERR_COUNT: invalid count", "MPI_Iallreduce(...)", "m.cc", 7);
  EXPECT_EQ(mpi.code(), absl::StatusCode::kInternal);
  EXPECT_NE(mpi.message().find("m.cc:7"), std::string::npos);
  EXPECT_NE(mpi.message().find("MPI_ERR_COUNT"), std::string::npos);
}

}  // namespace
}  // namespace zero
