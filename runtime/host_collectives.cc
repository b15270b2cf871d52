// Host-array collectives, always staged through the engine's own scratch memory: device
// scratch for device-only communicators, host scratch otherwise. The caller's arrays (often on
// its stack) are never handed to a collective, so a collective abandoned after a timeout can
// only ever touch memory the engine owns (and keeps, see EngineImpl's destructor).
#include "runtime/host_collectives.h"

#include <cstring>

namespace zero::runtime {

StatusOr<char*> HostCollectives::Scratch(int64_t bytes) {
  if (scratch_.bytes() < bytes) {
    scratch_.Reset();
    const Placement placement = path_.comm().device_buffers_only() ? Placement::kDevice : Placement::kHost;
    ZERO_ASSIGN_OR_RETURN(scratch_, allocator_.Allocate(bytes, MemoryCategory::kWorkspace, placement));
  }
  return scratch_.as<char>();
}

Status HostCollectives::CopyIn(char* scratch, const void* values, int64_t bytes) {
  if (!path_.comm().device_buffers_only()) {
    std::memcpy(scratch, values, bytes);
    return absl::OkStatus();
  }
  return ops_.Copy(scratch, values, bytes);
}

Status HostCollectives::CopyOut(void* values, const char* scratch, int64_t bytes) {
  if (!path_.comm().device_buffers_only()) {
    std::memcpy(values, scratch, bytes);
    return absl::OkStatus();
  }
  return ops_.Copy(values, scratch, bytes);
}

Status HostCollectives::AllReduce(float* values, int64_t count, comm::ReduceOp op) {
  if (path_.comm().size() == 1) return absl::OkStatus();  // one rank's values are the result
  const int64_t bytes = count * 4;
  ZERO_ASSIGN_OR_RETURN(char* scratch, Scratch(bytes));
  ZERO_RETURN_IF_ERROR(CopyIn(scratch, values, bytes));
  ZERO_RETURN_IF_ERROR(path_.RunOnHostMemory([&](comm::Communicator& comm) {
    return comm.AllReduce(scratch, scratch, count, DType::kFP32, op, comm::kHostValuesTag);
  }, "all-reduce of host values"));
  return CopyOut(values, scratch, bytes);
}

Status HostCollectives::AllGather(const void* send, void* recv, int64_t count, DType dtype) {
  const int64_t bytes = count * static_cast<int64_t>(DTypeSize(dtype));
  if (path_.comm().size() == 1) {  // one rank's values are the result
    if (bytes > 0 && recv != send) std::memmove(recv, send, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  ZERO_ASSIGN_OR_RETURN(char* scratch, Scratch(bytes * (path_.comm().size() + 1)));
  char* own = scratch + bytes * path_.comm().size();
  ZERO_RETURN_IF_ERROR(CopyIn(own, send, bytes));
  ZERO_RETURN_IF_ERROR(path_.RunOnHostMemory([&](comm::Communicator& comm) {
    return comm.AllGather(own, scratch, count, dtype, comm::kHostValuesTag);
  }, "all-gather of host values"));
  return CopyOut(recv, scratch, bytes * path_.comm().size());
}

}  // namespace zero::runtime
