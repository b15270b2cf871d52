// (Internal to runtime.) A 64-bit hash (XXH3) of param values in host or device memory, for
// comparing replicas across ranks (guard.init_params, guard.replica_check_every). Device
// values are hashed through a host staging buffer, 16 MiB at a time.
#ifndef ZERO_RUNTIME_REPLICA_HASH_H_
#define ZERO_RUNTIME_REPLICA_HASH_H_

#include <cstdint>

#include "base/allocator.h"
#include "runtime/device_ops.h"

namespace zero::runtime {

class ReplicaHasher {
 public:
  ReplicaHasher(DeviceOps& ops, base::Allocator allocator) : ops_(ops), allocator_(allocator) {}

  /// The hash of `bytes` bytes at `values`; equal bytes give equal hashes on every rank.
  StatusOr<uint64_t> Hash(const void* values, int64_t bytes);

 private:
  DeviceOps& ops_;
  base::Allocator allocator_;
  base::Buffer staging_;  // device values pass through here
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_REPLICA_HASH_H_
