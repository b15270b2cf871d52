// Where gradients live and how a bucket's gradients are reduced: the part of the stage policy
// that differs between stages (internal to runtime).
//
//   stage 0  full gradient buffer; all-reduce each bucket at the last micro-batch
//   stage 1  full gradient buffer; reduce-scatter each bucket in place at the last micro-batch
//   stage 2  only the rank's gradient shard persists; each micro-batch's bucket gradients go
//            into buffers from a bounded pool and are reduce-scattered: the step's first
//            micro-batch straight into the shard, later ones in place, their chunk then added
#ifndef ZERO_RUNTIME_GRAD_STORE_H_
#define ZERO_RUNTIME_GRAD_STORE_H_

#include <functional>
#include <memory>

#include "runtime/bucket_scheduler.h"
#include "zero/communicator.h"
#include "partition/partition_plan.h"
#include "base/allocator.h"
#include "runtime/device_ops.h"

namespace zero::runtime {

class GradStore {
 public:
  /// Waits for the oldest in-flight reduction (which frees its pool buffer), or fails when
  /// none is in flight.
  using WaitForBuffer = std::function<Status()>;

  /// Allocates the store of `stage` for `plan` on the ops' device, zeroed: the full gradient
  /// at stages 0 and 1, the rank's shard plus a pool of bucket buffers at stages 2 and 3.
  static StatusOr<std::unique_ptr<GradStore>> Create(int stage, const partition::PartitionPlan& plan,
                                                     int pool_buffers, comm::Communicator& comm,
                                                     base::Allocator& allocator, DeviceOps& ops,
                                                     WaitForBuffer wait_for_buffer);
  virtual ~GradStore() = default;

  /// Where this micro-batch's gradient of `param` is added.
  virtual StatusOr<void*> View(int param) = 0;
  /// The collective and completion step of a trainable bucket once its gradients are ready.
  /// `reduce` is false for micro-batches that only accumulate locally (stages 0-1).
  virtual StatusOr<std::pair<BucketScheduler::Launch, BucketScheduler::Finish>>
  Reduction(int bucket, bool reduce) = 0;
  /// The rank's reduced gradient for the part of `bucket` it steps (the whole bucket at stage 0,
  /// its shard otherwise); valid after the step's reductions completed.
  virtual void* OwnedGrad(int bucket) = 0;
  /// Zeroes every gradient for the next optimizer step.
  virtual Status Zero() = 0;
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_GRAD_STORE_H_
