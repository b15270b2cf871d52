// The C ABI's external communicator (zero_comm_external): a trainer's own collectives, given as
// a table of C functions, behind zero::comm::CreateExternalCommunicator.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/c_api_comm.h"
#include "runtime/c_api_status.h"
#include "zero/communicator.h"
#include "zero/zero.h"

using zero::c_api::Report;

namespace {

constexpr size_t kMessageCapacity = 1024;

// The C values the table sees are the C++ enums' own.
static_assert(ZERO_COLL_REDUCE_SCATTER == static_cast<int>(zero::comm::CollectiveKind::kReduceScatter) &&
              ZERO_COLL_ALL_GATHER == static_cast<int>(zero::comm::CollectiveKind::kAllGather) &&
              ZERO_COLL_ALL_REDUCE == static_cast<int>(zero::comm::CollectiveKind::kAllReduce) &&
              ZERO_COLL_BROADCAST == static_cast<int>(zero::comm::CollectiveKind::kBroadcast) &&
              ZERO_COLL_BARRIER == static_cast<int>(zero::comm::CollectiveKind::kBarrier));
static_assert(ZERO_FP32 == static_cast<int>(zero::DType::kFP32) && ZERO_BF16 == static_cast<int>(zero::DType::kBF16) &&
              ZERO_FP16 == static_cast<int>(zero::DType::kFP16) &&
              ZERO_COLL_INT64 == static_cast<int>(zero::DType::kInt64) &&
              ZERO_COLL_UINT8 == static_cast<int>(zero::DType::kUInt8));

// A table function's result as a Status: its code, and its message ("" when it wrote none).
zero::Status TableStatus(zero_status code, char* message, const char* function) {
  if (code == ZERO_OK) return absl::OkStatus();
  message[kMessageCapacity - 1] = '\0';  // a table that filled the whole buffer
  const std::string text = message[0] != '\0' ? message : absl::StrCat("the table's ", function, " failed");
  const int value = static_cast<int>(code);
  const bool canonical = value > 0 && value <= static_cast<int>(absl::StatusCode::kUnauthenticated);
  return zero::Status(canonical ? static_cast<absl::StatusCode>(value) : absl::StatusCode::kUnknown, text);
}

zero::comm::ExternalCollectives Wrap(const zero_collectives& c) {
  zero::comm::ExternalCollectives table;
  table.start = [c](const zero::comm::ExternalCollective& op) -> zero::StatusOr<int64_t> {
    const zero_collective collective{static_cast<int>(op.kind), op.send,  op.recv,   op.count,
                                     static_cast<int>(op.dtype), static_cast<int>(op.op), op.root, op.channel};
    char message[kMessageCapacity] = {0};
    int64_t handle = 0;
    const zero::Status started = TableStatus(c.start(c.context, &collective, &handle, message, kMessageCapacity),
                                             message, "start");
    if (!started.ok()) return started;
    return handle;
  };
  table.wait = [c](int64_t handle, double timeout_s) {
    char message[kMessageCapacity] = {0};
    return TableStatus(c.wait(c.context, handle, timeout_s, message, kMessageCapacity), message, "wait");
  };
  table.test = [c](int64_t handle) { return c.test(c.context, handle) != 0; };
  table.release = [c](int64_t handle) { c.release(c.context, handle); };
  if (c.destroy != nullptr) table.destroy = [c] { c.destroy(c.context); };
  return table;
}

}  // namespace

extern "C" {

zero_status zero_comm_external(int rank, int size, int ranks_on_this_host, double check_timeout_s,
                               const zero_collectives* collectives, zero_comm** out) try {
  ZERO_C_REQUIRE(collectives, "zero_comm_external");
  ZERO_C_REQUIRE(out, "zero_comm_external");
  *out = nullptr;
  if (!collectives->start || !collectives->wait || !collectives->test || !collectives->release) {
    return Report(absl::InvalidArgumentError(
        "zero_comm_external: the table needs start, wait, test and release functions (destroy may be NULL)"));
  }
  auto comm = zero::comm::CreateExternalCommunicator(rank, size, Wrap(*collectives),
                                                     {ranks_on_this_host, check_timeout_s});
  if (!comm.ok()) return Report(comm.status());
  *out = new zero_comm{std::move(*comm)};
  return ZERO_OK;
} ZERO_C_CATCH("zero_comm_external")

}  // extern "C"
