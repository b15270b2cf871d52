// Where gradients live and how a bucket's gradients are reduced: the part of the stage policy
// that differs between stages (internal to runtime).
//
//   stage 0  full gradient buffer; all-reduce each bucket at the last micro-batch
//   stage 1  full gradient buffer; reduce-scatter each bucket in place at the last micro-batch
//   stage 2-3  only the rank's gradient shard persists; each micro-batch's bucket gradients
//            go into buffers from a bounded pool and are reduce-scattered: the step's first
//            micro-batch straight into the shard, later ones in place, their chunk then added.
//            A buffer returns to the pool in its reduction's Finish; when none is free, the
//            engine waits for the oldest reduction in flight (NeedsBufferWait), or, with none
//            in flight, adds a buffer to the pool (AddPoolBuffer).
//
// Every gradient is held, reduced and handed to the optimizer in its bucket's gradient dtype
// (partition::Bucket::grad_dtype, laid out by the plan's gradient layout), which may be wider
// than the params' (fp32 gradients for bf16/fp16 params).
//
// Slots are not zeroed ahead: a param's first gradient since its slot was last reduced (or
// since Zero) is copied into it, later ones added; just before a bucket's reduction the
// slots nobody wrote, and the gaps between params, are zeroed. A gradient costs one copy
// instead of a zeroing pass and an addition. Where the copy would be all (one rank, the
// step's last micro-batch), the trainer may lend the gradient instead (Lend): the optimizer
// and the norm read it where it is, and it costs nothing.
#ifndef ZERO_RUNTIME_GRAD_STORE_H_
#define ZERO_RUNTIME_GRAD_STORE_H_

#include <memory>

#include "runtime/bucket_scheduler.h"
#include "zero/communicator.h"
#include "partition/partition_plan.h"
#include "base/allocator.h"
#include "runtime/device_ops.h"

namespace zero::runtime {

class GradStore {
 public:
  /// Allocates the store of `stage` for `plan` on the ops' device, zeroed: the full gradient
  /// at stages 0 and 1, the rank's shard plus a pool of `pool_buffers` bucket buffers at
  /// stages 2 and 3.
  static StatusOr<std::unique_ptr<GradStore>> Create(int stage, const partition::PartitionPlan& plan,
                                                     int pool_buffers, comm::Communicator& comm,
                                                     base::Allocator& allocator, DeviceOps& ops);
  virtual ~GradStore() = default;

  /// Whether `bucket` has no buffer this micro-batch and the pool has none free: the caller
  /// must first wait for a reduction in flight (its Finish returns a buffer to the pool).
  /// View and Reduction of such a bucket fail with kFailedPrecondition.
  virtual bool NeedsBufferWait(int bucket) const = 0;
  /// Whether `bucket`'s Reduction reads a lent gradient and needs no buffer (Lend without
  /// one): no wait for a free buffer before it.
  virtual bool ReducesWithoutBuffer(int /*bucket*/) const { return false; }
  /// Bucket buffers in the pool (0 for a store without one).
  virtual int pool_buffers() const { return 0; }
  /// Adds one free buffer to the pool, for when every buffer is held by a bucket still being
  /// filled and no reduction in flight will free one. kFailedPrecondition for a store without
  /// a pool or one that already has a buffer per trainable bucket; kResourceExhausted when
  /// the memory is not available.
  virtual Status AddPoolBuffer() {
    return absl::FailedPreconditionError("this gradient store has no buffer pool to grow");
  }
  /// Where this micro-batch's gradient of `param` is added (its bucket's gradient dtype),
  /// holding what was accumulated so far (zeros at first).
  virtual StatusOr<void*> View(int param) = 0;
  /// Adds `grad` (the param's numel elements in `dtype`, the param's dtype, on the ops'
  /// device) into `param`'s gradient: copied (widened) when it is the first since the slot
  /// was reset.
  virtual Status Accumulate(int param, const void* grad, DType dtype) = 0;
  /// Takes `grad` (the param's numel elements in `dtype`, on the ops' device) as `param`'s
  /// gradient without copying it, where a copy is all the store would do with it: one rank
  /// (the reduction is an identity), `last_micro_batch`, nothing accumulated for the param
  /// since Zero, and `dtype` the bucket's gradient dtype. Returns true then: the store reads
  /// `grad` where it is (LentGrad) until Zero, and the caller leaves it unchanged until then.
  /// Otherwise returns false and does nothing (the caller copies it with Accumulate). A later
  /// gradient for the param (Accumulate, View) first copies the lent one into its slot.
  virtual StatusOr<bool> Lend(int param, const void* grad, DType dtype, bool last_micro_batch) = 0;
  /// Whether Lend would keep `grad` without taking a bucket buffer (several ranks, a param
  /// that fills its bucket, before the bucket has one): the caller need not wait for a free
  /// buffer first (NeedsBufferWait).
  virtual bool LendsWithoutBuffer(int /*param*/, DType /*dtype*/, bool /*last_micro_batch*/) const { return false; }
  /// Copies `param`'s lent gradient into its slot (or, one rank, into the shard once its bucket
  /// was reduced), which holds it from then on; nothing is lent for it any more, also when
  /// the copy fails. Nothing to do when it has none.
  virtual Status TakeBack(int param) = 0;
  /// `param`'s lent gradient (Lend) until Zero, or null.
  virtual const void* LentGrad(int param) const = 0;
  /// Whether any param's gradient is lent this step.
  virtual bool any_lent() const = 0;
  /// The collective and completion step of a trainable bucket once its gradients are ready.
  /// Stores that keep full gradients (stages 0-1) only accumulate locally until the step's
  /// last micro-batch, and return no collective before it.
  virtual StatusOr<std::pair<BucketScheduler::Launch, BucketScheduler::Finish>>
  Reduction(int bucket, bool last_micro_batch) = 0;
  /// The rank's reduced gradient for the part of `bucket` it steps (PartitionPlan::Owned), in
  /// the bucket's gradient dtype; valid after the step's reductions completed.
  virtual void* OwnedGrad(int bucket) = 0;
  /// Starts the next optimizer step's gradients (all zero; nothing lent). A store whose
  /// first reduction of a bucket overwrites the rank's gradient of it may only mark it zero
  /// here; ZeroUnreduced then writes the zeros a step would read.
  virtual Status Zero() = 0;
  /// Before a step reads OwnedGrad: zeroes the rank's gradient of every bucket not reduced
  /// since Zero (none in a step whose backward reached every bucket: no memory pass).
  virtual Status ZeroUnreduced() { return absl::OkStatus(); }
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_GRAD_STORE_H_
