// The stage-0/1 full gradient buffer and the stage-2 shard with its bucket-buffer pool.
#include "runtime/grad_store.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace zero::runtime {
namespace {

using partition::Bucket;

// Stages 0 and 1: every trainable bucket's whole gradient (the plan's flat gradient layout).
class FullGradStore final : public GradStore {
 public:
  FullGradStore(const partition::PartitionPlan& plan, comm::Communicator& comm, DeviceOps& ops,
                base::Buffer buffer)
      : plan_(plan), comm_(comm), ops_(ops), buffer_(std::move(buffer)) {}

  StatusOr<void*> View(int param) override {
    const auto& place = plan_.placement(param);
    return BucketBase(place.bucket) + plan_.ParamGradByteOffset(param);
  }

  StatusOr<std::pair<BucketScheduler::Launch, BucketScheduler::Finish>> Reduction(
      int bucket, bool last_micro_batch) override {
    if (!last_micro_batch) return std::pair<BucketScheduler::Launch, BucketScheduler::Finish>{};
    const Bucket& b = plan_.buckets()[bucket];
    char* base = BucketBase(bucket);
    BucketScheduler::Launch launch;
    if (!plan_.ranks_own_shards()) {
      launch = [this, base, &b] {
        return comm_.AllReduce(base, base, b.numel, b.grad_dtype, comm::ReduceOp::kSum);
      };
    } else {
      char* own = base + b.grad_shard_byte_offset(comm_.rank());
      launch = [this, base, own, &b] {
        return comm_.ReduceScatter(base, own, b.shard_numel, b.grad_dtype, comm::ReduceOp::kSum);
      };
    }
    return std::make_pair(std::move(launch), BucketScheduler::Finish());
  }

  void* OwnedGrad(int bucket) override {
    const Bucket& b = plan_.buckets()[bucket];
    return BucketBase(bucket) + plan_.Owned(bucket, comm_.rank()).begin * b.grad_element_bytes();
  }

  bool NeedsBufferWait(int) const override { return false; }

  Status Zero() override { return ops_.Zero(buffer_.data(), buffer_.bytes()); }

 private:
  char* BucketBase(int bucket) {
    return buffer_.as<char>() + plan_.buckets()[bucket].grad_byte_offset;
  }

  const partition::PartitionPlan& plan_;
  comm::Communicator& comm_;
  DeviceOps& ops_;
  base::Buffer buffer_;
};

// Stages 2-3: the rank's shard persists; bucket gradients pass through pooled buffers.
class ShardedGradStore final : public GradStore {
 public:
  ShardedGradStore(const partition::PartitionPlan& plan, comm::Communicator& comm, DeviceOps& ops,
                   base::Buffer shard, std::vector<base::Buffer> pool)
      : plan_(plan), comm_(comm), ops_(ops), shard_(std::move(shard)), pool_(std::move(pool)),
        holder_(plan.buckets().size(), -1), shard_is_zero_(plan.buckets().size(), true) {
    for (int i = static_cast<int>(pool_.size()) - 1; i >= 0; --i) free_.push_back(i);
  }

  StatusOr<void*> View(int param) override {
    const auto& place = plan_.placement(param);
    ZERO_ASSIGN_OR_RETURN(char* base, BucketBuffer(place.bucket));
    return base + plan_.ParamGradByteOffset(param);
  }

  StatusOr<std::pair<BucketScheduler::Launch, BucketScheduler::Finish>> Reduction(
      int bucket, bool) override {
    const Bucket& b = plan_.buckets()[bucket];
    ZERO_ASSIGN_OR_RETURN(char* base, BucketBuffer(bucket));  // a bucket nobody wrote: zeros
    // The first reduction of a bucket since Zero() writes its sum straight into the shard;
    // later micro-batches reduce in place and add their chunk, after the collective.
    const bool first = shard_is_zero_[bucket];
    shard_is_zero_[bucket] = false;
    char* own = first ? static_cast<char*>(OwnedGrad(bucket)) : base + b.grad_shard_byte_offset(comm_.rank());
    BucketScheduler::Launch launch = [this, base, own, &b] {
      return comm_.ReduceScatter(base, own, b.shard_numel, b.grad_dtype, comm::ReduceOp::kSum);
    };
    BucketScheduler::Finish finish = [this, bucket, own, first, &b] {
      // Queued before any later reuse of the pool buffer (which first zeroes it) on the device.
      Status added = first ? absl::OkStatus() : ops_.AddInto(OwnedGrad(bucket), own, b.shard_numel, b.grad_dtype);
      free_.push_back(holder_[bucket]);
      holder_[bucket] = -1;
      return added;
    };
    return std::make_pair(std::move(launch), std::move(finish));
  }

  void* OwnedGrad(int bucket) override { return shard_.as<char>() + plan_.buckets()[bucket].grad_shard_offset; }

  bool NeedsBufferWait(int bucket) const override { return holder_[bucket] < 0 && free_.empty(); }

  int pool_buffers() const override { return static_cast<int>(pool_.size()); }

  Status Zero() override {
    shard_is_zero_.assign(shard_is_zero_.size(), true);
    return ops_.Zero(shard_.data(), shard_.bytes());
  }

 private:
  // The pool buffer holding `bucket` this micro-batch, taking (and zeroing) one if needed.
  StatusOr<char*> BucketBuffer(int bucket) {
    if (holder_[bucket] < 0) {
      if (free_.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "no free gradient buffer for bucket ", bucket, " (NeedsBufferWait was not honoured)"));
      }
      holder_[bucket] = free_.back();
      free_.pop_back();
      const Bucket& b = plan_.buckets()[bucket];
      ZERO_RETURN_IF_ERROR(ops_.Zero(pool_[holder_[bucket]].data(), b.grad_bytes()));
    }
    return pool_[holder_[bucket]].as<char>();
  }

  const partition::PartitionPlan& plan_;
  comm::Communicator& comm_;
  DeviceOps& ops_;
  base::Buffer shard_;  // one gradient shard of every trainable bucket (Bucket::grad_shard_offset)
  std::vector<base::Buffer> pool_;
  std::vector<int> holder_;  // pool buffer index per bucket this micro-batch, or -1
  std::vector<int> free_;
  std::vector<bool> shard_is_zero_;  // per bucket: no reduction since Zero()
};

}  // namespace

StatusOr<std::unique_ptr<GradStore>> GradStore::Create(int stage,
                                                       const partition::PartitionPlan& plan,
                                                       int pool_buffers, comm::Communicator& comm,
                                                       base::Allocator& allocator, DeviceOps& ops) {
  std::unique_ptr<GradStore> store;
  if (stage <= 1) {
    ZERO_ASSIGN_OR_RETURN(base::Buffer buffer,
                          allocator.Allocate(plan.grad_flat_bytes(), MemoryCategory::kGrads, ops.placement()));
    store.reset(new FullGradStore(plan, comm, ops, std::move(buffer)));
    ZERO_RETURN_IF_ERROR(store->Zero());
    return store;
  }
  int64_t largest_bucket = 0;
  int trainable = 0;
  for (const Bucket& b : plan.buckets()) {
    if (!b.trainable) continue;
    ++trainable;
    largest_bucket = std::max(largest_bucket, b.grad_bytes());
  }
  ZERO_ASSIGN_OR_RETURN(base::Buffer shard,
                        allocator.Allocate(plan.grad_shards_bytes(), MemoryCategory::kGrads, ops.placement()));
  std::vector<base::Buffer> pool;
  for (int i = 0; i < std::min(pool_buffers, trainable); ++i) {
    ZERO_ASSIGN_OR_RETURN(base::Buffer buffer, allocator.Allocate(largest_bucket, MemoryCategory::kCommBuffers,
                                                                  ops.placement()));
    pool.push_back(std::move(buffer));
  }
  store.reset(new ShardedGradStore(plan, comm, ops, std::move(shard), std::move(pool)));
  ZERO_RETURN_IF_ERROR(store->Zero());
  return store;
}

}  // namespace zero::runtime
