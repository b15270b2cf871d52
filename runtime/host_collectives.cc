// Host-array collectives, staged through device scratch for device-only communicators.
#include "runtime/host_collectives.h"

namespace zero::runtime {

StatusOr<char*> HostCollectives::Scratch(int64_t bytes) {
  if (scratch_.bytes() < bytes) {
    scratch_.Reset();
    ZERO_ASSIGN_OR_RETURN(scratch_, allocator_.Allocate(bytes, MemoryCategory::kWorkspace, Placement::kDevice));
  }
  return scratch_.as<char>();
}

Status HostCollectives::AllReduce(float* values, int64_t count, comm::ReduceOp op) {
  if (!comm_.device_buffers_only()) {
    return comm_.AllReduce(values, values, count, DType::kFP32, op)->Wait(timeout_s_);
  }
  const int64_t bytes = count * 4;
  ZERO_ASSIGN_OR_RETURN(char* device, Scratch(bytes));
  ZERO_RETURN_IF_ERROR(ops_.Copy(device, values, bytes));
  ZERO_RETURN_IF_ERROR(comm_.AllReduce(device, device, count, DType::kFP32, op)->Wait(timeout_s_));
  return ops_.Copy(values, device, bytes);
}

Status HostCollectives::AllGather(const void* send, void* recv, int64_t count, DType dtype) {
  if (!comm_.device_buffers_only()) return comm_.AllGather(send, recv, count, dtype)->Wait(timeout_s_);
  const int64_t bytes = count * static_cast<int64_t>(DTypeSize(dtype));
  ZERO_ASSIGN_OR_RETURN(char* device, Scratch(bytes * (comm_.size() + 1)));
  char* own = device + bytes * comm_.size();
  ZERO_RETURN_IF_ERROR(ops_.Copy(own, send, bytes));
  ZERO_RETURN_IF_ERROR(comm_.AllGather(own, device, count, dtype)->Wait(timeout_s_));
  return ops_.Copy(recv, device, bytes * comm_.size());
}

}  // namespace zero::runtime
