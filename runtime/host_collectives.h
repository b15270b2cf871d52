// Collectives on small host arrays — the step's norm and flags, LAMB's per-param sums, registry
// and layout hashes — over any backend (internal to runtime). The values travel through scratch
// memory the engine owns (device scratch for communicators that take device buffers only), so
// an abandoned collective never touches the caller's arrays.
#ifndef ZERO_RUNTIME_HOST_COLLECTIVES_H_
#define ZERO_RUNTIME_HOST_COLLECTIVES_H_

#include "base/allocator.h"
#include "runtime/collective_path.h"
#include "runtime/device_ops.h"
#include "zero/communicator.h"

namespace zero::runtime {

class HostCollectives {
 public:
  /// Collectives go through `path` (and wait at most its timeout). They need no stream wait:
  /// the scratch is host memory, or device memory written by copies on the stream of a
  /// communicator that orders itself after it (NCCL).
  HostCollectives(CollectivePath& path, DeviceOps& ops, base::Allocator allocator)
      : path_(path), ops_(ops), allocator_(allocator) {}

  /// In-place all-reduce of `count` host floats.
  Status AllReduce(float* values, int64_t count, comm::ReduceOp op);
  /// All-gather of `count` host elements per rank into `recv` (size() · count elements).
  Status AllGather(const void* send, void* recv, int64_t count, DType dtype);

 private:
  // Scratch of at least `bytes`, on the device when the communicator needs device buffers.
  StatusOr<char*> Scratch(int64_t bytes);
  // Host values into scratch and back.
  Status CopyIn(char* scratch, const void* values, int64_t bytes);
  Status CopyOut(void* values, const char* scratch, int64_t bytes);

  CollectivePath& path_;
  DeviceOps& ops_;
  base::Allocator allocator_;
  base::Buffer scratch_;
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_HOST_COLLECTIVES_H_
