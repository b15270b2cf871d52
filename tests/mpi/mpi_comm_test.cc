// The MPI communicator under mpirun: the conformance suite, and the failure cases (a rank that
// never joins a collective, ranks whose collectives disagree).
#include <gtest/gtest.h>

#include <vector>

#include "zero/communicator.h"
#include "tests/comm/conformance.h"

namespace zero::comm {
namespace {

std::unique_ptr<Communicator> NewComm(MpiOptions options = {}) {
  auto comm = CreateMpiCommunicator(nullptr, options);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(*comm) : nullptr;
}

TEST(MpiComm, ConformanceSuite) {
  auto comm = NewComm();
  ASSERT_NE(comm, nullptr);
  const Status status = testing::RunConformanceSuite(*comm, /*pairwise_rounding=*/true);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(MpiComm, ConformanceSuiteWithSignatureChecks) {
  auto comm = NewComm({/*check_signatures=*/true});
  ASSERT_NE(comm, nullptr);
  const Status status = testing::RunConformanceSuite(*comm, /*pairwise_rounding=*/true);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(MpiComm, ARankThatNeverJoinsGivesDeadlineExceeded) {
  auto comm = NewComm();
  auto side = NewComm();  // a second channel on which the ranks meet again
  ASSERT_NE(comm, nullptr);
  ASSERT_NE(side, nullptr);
  const int last = comm->size() - 1;
  float x = 1, y = 0;
  if (comm->rank() != last) {
    const Status status = comm->AllReduce(&x, &y, 1, DType::kFP32, ReduceOp::kSum)->Wait(0.5);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_NE(status.message().find("AllReduce(count=1, fp32, sum)"), std::string::npos) << status;
  }
  // Everyone meets again, the late rank joins the first collective, and the group recovers.
  float ack = 0;
  ASSERT_TRUE(side->Barrier()->Wait(30).ok());
  if (comm->rank() == last) {
    EXPECT_TRUE(comm->AllReduce(&x, &y, 1, DType::kFP32, ReduceOp::kSum)->Wait(30).ok());
  }
  EXPECT_TRUE(comm->AllReduce(&ack, &ack, 1, DType::kFP32, ReduceOp::kSum)->Wait(30).ok());
}

TEST(MpiComm, MismatchedCountsAreAnErrorOnEveryRank) {
  auto comm = NewComm({/*check_signatures=*/true});
  ASSERT_NE(comm, nullptr);
  const int64_t count = comm->rank() == 0 ? 3 : 4;  // rank 0 diverged
  std::vector<float> data(4 * comm->size(), 2.0f), out(4, -5.0f);
  const Status status =
      comm->ReduceScatter(data.data(), out.data(), count, DType::kFP32, ReduceOp::kSum)->Wait(30);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("mismatch"), std::string::npos) << status;
  EXPECT_EQ(out, std::vector<float>(4, -5.0f));  // nothing was written
  // The communicator is still consistent: the next collective works.
  float one = 1;
  EXPECT_TRUE(comm->AllReduce(&one, &one, 1, DType::kFP32, ReduceOp::kSum)->Wait(30).ok());
  EXPECT_EQ(one, static_cast<float>(comm->size()));
}

TEST(MpiComm, InvalidArgumentsAreReportedWithoutCallingMpi) {
  auto comm = NewComm();
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->AllReduce(nullptr, nullptr, 4, DType::kFP32, ReduceOp::kSum)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  float x = 0;
  EXPECT_EQ(comm->Broadcast(&x, 1, DType::kFP32, comm->size())->Wait().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zero::comm
