// The stage-0/1 full gradient buffer and the stage-2 shard with its bucket-buffer pool.
#include "runtime/grad_store.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zero::runtime {
namespace {

using partition::Bucket;

// Which params' gradient slots hold a value: the first gradient since a slot was reset is
// copied into it, later ones added; before a reduction the slots nobody wrote and the gaps
// between params (alignment, padding) are zeroed.
class GradSlots {
 public:
  explicit GradSlots(const partition::PartitionPlan& plan)
      : plan_(plan), written_(plan.params().size(), 0), lent_(plan.params().size(), nullptr),
        by_offset_(plan.buckets().size()), filling_(plan.buckets().size(), -1) {
    for (const Bucket& b : plan.buckets()) {
      by_offset_[b.index] = b.params;
      std::sort(by_offset_[b.index].begin(), by_offset_[b.index].end(),
                [&plan](int x, int y) { return plan.placement(x).offset < plan.placement(y).offset; });
      if (b.params.size() == 1 && plan.placement(b.params[0]).offset == 0 &&
          plan.placement(b.params[0]).numel == b.numel) {
        filling_[b.index] = b.params[0];
      }
    }
  }

  void Reset(int bucket) {
    for (int p : plan_.buckets()[bucket].params) written_[p] = 0;
  }
  void ResetAll() { std::fill(written_.begin(), written_.end(), 0); }

  // `slot` (param's place in its bucket's gradient) ready to be added into: zeroed if unwritten.
  Status Prepare(int param, void* slot, DeviceOps& ops) {
    if (written_[param]) return absl::OkStatus();
    ZERO_RETURN_IF_ERROR(ops.Zero(slot, plan_.ParamGradBytes(param)));
    written_[param] = 1;
    return absl::OkStatus();
  }

  // `grad` (the param's elements in `dtype`) into `slot`: copied (widened) if unwritten, else added.
  Status Write(int param, void* slot, const void* grad, DType dtype, DeviceOps& ops) {
    const DType grad_dtype = plan_.buckets()[plan_.placement(param).bucket].grad_dtype;
    const int64_t numel = plan_.placement(param).numel;
    Status status;
    if (!written_[param]) {
      status = grad_dtype == dtype ? ops.CopyOnDevice(slot, grad, plan_.ParamGradBytes(param))
                                   : ops.Widen(static_cast<float*>(slot), grad, numel, dtype);
    } else {
      status = grad_dtype == dtype ? ops.AddInto(slot, grad, numel, dtype)
                                   : ops.AddIntoFloat(static_cast<float*>(slot), grad, numel, dtype);
    }
    if (status.ok()) written_[param] = 1;
    return status;
  }

  bool written(int param) const { return written_[param] != 0; }

  // True when `param` alone fills its bucket (no other param, no alignment gap, no padding):
  // its gradient is the bucket's whole gradient, so a collective can read it where it is.
  bool FillsBucket(int param) const { return filling_[plan_.placement(param).bucket] == param; }
  // Whether `param`'s gradient in `dtype` may be lent on `world` ranks in the step's last
  // micro-batch (`last`): the bucket's gradient dtype, and one rank or a param that fills its
  // bucket. (The stores add what their buffers need.)
  bool MayLend(int param, DType dtype, int world, bool last) const {
    return last && (world == 1 || FillsBucket(param)) &&
           dtype == plan_.buckets()[plan_.placement(param).bucket].grad_dtype;
  }
  // The lent gradient that is `bucket`'s whole gradient (FillsBucket), or null.
  const void* LentFilling(int bucket) const {
    return filling_[bucket] < 0 ? nullptr : lent_[filling_[bucket]];
  }
  // `bucket`'s reduction has read its lent gradient (LentFilling): the reduced value is in the
  // engine's memory from now on.
  void ReducedFilling(int bucket) { Unlend(filling_[bucket]); }

  // `grad` is `param`'s gradient, read where it is: its slot counts as written (nothing to
  // zero there) but is never read while the gradient is lent.
  void Lend(int param, const void* grad) {
    written_[param] = 1;
    lent_count_ += lent_[param] == nullptr;
    lent_[param] = grad;
  }
  const void* lent(int param) const { return lent_[param]; }
  // Nothing is lent for `param` any more (its gradient is lost with the call that lent it).
  // At one rank a lent param's part of the shard is not written by its bucket's reduction
  // (CopyAllButLent) nor cleared by Zero: unlent without TakeBackLent after that reduction, it
  // holds what an earlier step left there; the call that unlends so reports the gradient lost.
  void Unlend(int param) {
    lent_count_ -= lent_[param] != nullptr;
    lent_[param] = nullptr;
  }
  bool any_lent() const { return lent_count_ > 0; }
  void ForgetLent() {
    std::fill(lent_.begin(), lent_.end(), nullptr);
    lent_count_ = 0;
  }
  // A lent gradient copied into `slot`, which holds it from now on (before a later gradient
  // of the param is added).
  Status TakeBackLent(int param, void* slot, DeviceOps& ops) {
    const void* grad = lent_[param];
    if (grad == nullptr) return absl::OkStatus();
    Unlend(param);
    ZERO_RETURN_IF_ERROR(ops.CopyOnDevice(slot, grad, plan_.ParamGradBytes(param)));
    written_[param] = 1;  // a later gradient adds to it (also in a buffer taken after the lend)
    return absl::OkStatus();
  }

  // Zeroes, in `bucket`'s gradient at `base`, every element outside the written slots, in as
  // few runs as the written slots leave.
  Status ZeroUnwritten(int bucket, char* base, DeviceOps& ops) const {
    const int64_t element = plan_.buckets()[bucket].grad_element_bytes();
    return ForRunsBetween(bucket, [this](int p) { return written_[p] != 0; }, [&](int64_t begin, int64_t end) {
      return ops.Zero(base + begin * element, (end - begin) * element);
    });
  }

  // fn(begin, end) for each run of `bucket`'s elements (bucket coordinates, in order) that
  // the params for which skip(param) holds leave between them.
  template <typename Skip, typename Fn>
  Status ForRunsBetween(int bucket, Skip skip, Fn fn) const {
    const int64_t numel = plan_.buckets()[bucket].numel;
    int64_t run = 0;  // the first element of the next run
    for (int p : by_offset_[bucket]) {
      if (!skip(p)) continue;
      const partition::ParamPlacement& place = plan_.placement(p);
      if (place.offset > run) ZERO_RETURN_IF_ERROR(fn(run, place.offset));
      run = place.offset + place.numel;
    }
    return run < numel ? fn(run, numel) : absl::OkStatus();
  }

 private:
  const partition::PartitionPlan& plan_;
  std::vector<char> written_;  // per param
  std::vector<const void*> lent_;  // per param: its lent gradient, or null
  int64_t lent_count_ = 0;
  std::vector<std::vector<int>> by_offset_;  // per bucket: its params by offset
  std::vector<int> filling_;  // per bucket: the param that fills it alone (FillsBucket), or -1
};

// Stages 0 and 1: every trainable bucket's whole gradient (the plan's flat gradient layout).
class FullGradStore final : public GradStore {
 public:
  FullGradStore(const partition::PartitionPlan& plan, comm::Communicator& comm, DeviceOps& ops,
                base::Buffer buffer)
      : plan_(plan), comm_(comm), ops_(ops), buffer_(std::move(buffer)), slots_(plan) {}

  StatusOr<void*> View(int param) override {
    void* slot = Slot(param);
    ZERO_RETURN_IF_ERROR(slots_.TakeBackLent(param, slot, ops_));
    ZERO_RETURN_IF_ERROR(slots_.Prepare(param, slot, ops_));
    return slot;
  }

  Status Accumulate(int param, const void* grad, DType dtype) override {
    ZERO_RETURN_IF_ERROR(slots_.TakeBackLent(param, Slot(param), ops_));
    return slots_.Write(param, Slot(param), grad, dtype, ops_);
  }

  // One rank: the step reads the lent gradient. Several: only a param that fills its bucket
  // is kept, and its bucket's collective reads it in place of the bucket (see Reduction).
  StatusOr<bool> Lend(int param, const void* grad, DType dtype, bool last_micro_batch) override {
    if (!slots_.MayLend(param, dtype, comm_.size(), last_micro_batch) || slots_.written(param)) return false;
    slots_.Lend(param, grad);
    return true;
  }

  StatusOr<std::pair<BucketScheduler::Launch, BucketScheduler::Finish>> Reduction(
      int bucket, bool last_micro_batch) override {
    if (!last_micro_batch) return std::pair<BucketScheduler::Launch, BucketScheduler::Finish>{};
    const Bucket& b = plan_.buckets()[bucket];
    char* base = BucketBase(bucket);
    ZERO_RETURN_IF_ERROR(slots_.ZeroUnwritten(bucket, base, ops_));
    // At world size 1 the reduction, in place, changes nothing: no collective.
    if (comm_.size() == 1) return std::pair<BucketScheduler::Launch, BucketScheduler::Finish>{};
    // A lent gradient filling the bucket is its whole input (the bucket's memory holds
    // nothing of this step before the collective writes the sum there).
    const void* lent = slots_.LentFilling(bucket);
    const void* source = lent != nullptr ? lent : base;
    BucketScheduler::Launch launch;
    if (!plan_.ranks_own_shards()) {
      launch = [this, source, base, &b] {
        return comm_.AllReduce(source, base, b.numel, b.grad_dtype, comm::ReduceOp::kSum);
      };
    } else {
      char* own = base + b.grad_shard_byte_offset(comm_.rank());
      launch = [this, source, own, &b] {
        return comm_.ReduceScatter(source, own, b.shard_numel, b.grad_dtype, comm::ReduceOp::kSum);
      };
    }
    BucketScheduler::Finish finish;
    if (lent != nullptr) {
      finish = [this, bucket] {
        slots_.ReducedFilling(bucket);
        return absl::OkStatus();
      };
    }
    return std::make_pair(std::move(launch), std::move(finish));
  }

  void* OwnedGrad(int bucket) override {
    const Bucket& b = plan_.buckets()[bucket];
    return BucketBase(bucket) + plan_.Owned(bucket, comm_.rank()).begin * b.grad_element_bytes();
  }

  bool NeedsBufferWait(int) const override { return false; }
  const void* LentGrad(int param) const override { return slots_.lent(param); }
  bool any_lent() const override { return slots_.any_lent(); }
  Status TakeBack(int param) override { return slots_.TakeBackLent(param, Slot(param), ops_); }

  Status Zero() override {
    slots_.ResetAll();  // each slot is copied into, or zeroed, before it is read again
    slots_.ForgetLent();
    return absl::OkStatus();
  }

 private:
  char* BucketBase(int bucket) {
    return buffer_.as<char>() + plan_.buckets()[bucket].grad_byte_offset;
  }
  char* Slot(int param) { return BucketBase(plan_.placement(param).bucket) + plan_.ParamGradByteOffset(param); }

  const partition::PartitionPlan& plan_;
  comm::Communicator& comm_;
  DeviceOps& ops_;
  base::Buffer buffer_;
  GradSlots slots_;
};

// Stages 2-3: the rank's shard persists; bucket gradients pass through pooled buffers.
class ShardedGradStore final : public GradStore {
 public:
  ShardedGradStore(const partition::PartitionPlan& plan, comm::Communicator& comm, DeviceOps& ops,
                   base::Allocator allocator, base::Buffer shard, std::vector<base::Buffer> pool)
      : plan_(plan), comm_(comm), ops_(ops), allocator_(std::move(allocator)), shard_(std::move(shard)),
        pool_(std::move(pool)), holder_(plan.buckets().size(), -1), shard_is_zero_(plan.buckets().size(), true),
        slots_(plan) {
    for (int i = static_cast<int>(pool_.size()) - 1; i >= 0; --i) free_.push_back(i);
    for (const Bucket& b : plan_.buckets()) {
      if (!b.trainable) continue;
      ++trainable_buckets_;
      largest_bucket_bytes_ = std::max(largest_bucket_bytes_, b.grad_bytes());
    }
  }

  int trainable_buckets() const { return trainable_buckets_; }

  Status AddPoolBuffer() override {
    if (static_cast<int>(pool_.size()) >= trainable_buckets_) {
      return absl::FailedPreconditionError(absl::StrCat("the gradient buffer pool already holds one buffer per "
                                                        "trainable bucket (", trainable_buckets_, ")"));
    }
    ZERO_ASSIGN_OR_RETURN(base::Buffer buffer, allocator_.Allocate(largest_bucket_bytes_, MemoryCategory::kCommBuffers,
                                                                   ops_.placement()));
    pool_.push_back(std::move(buffer));
    free_.push_back(static_cast<int>(pool_.size()) - 1);
    return absl::OkStatus();
  }

  StatusOr<void*> View(int param) override {
    ZERO_ASSIGN_OR_RETURN(char* slot, Slot(param));
    ZERO_RETURN_IF_ERROR(slots_.TakeBackLent(param, slot, ops_));
    ZERO_RETURN_IF_ERROR(slots_.Prepare(param, slot, ops_));
    return slot;
  }

  Status Accumulate(int param, const void* grad, DType dtype) override {
    ZERO_ASSIGN_OR_RETURN(char* slot, Slot(param));
    ZERO_RETURN_IF_ERROR(slots_.TakeBackLent(param, slot, ops_));
    return slots_.Write(param, slot, grad, dtype, ops_);
  }

  // One rank: the bucket's first reduction of the step is then a copy into the shard, which
  // leaves the lent param's part out (see Reduction). Several ranks: only a param that fills
  // its bucket is kept, and the bucket's reduce-scatter reads it in place of the pool buffer;
  // lent before its bucket has a buffer, it takes none (LendsWithoutBuffer).
  StatusOr<bool> Lend(int param, const void* grad, DType dtype, bool last_micro_batch) override {
    const int bucket = plan_.placement(param).bucket;
    if (LendsWithoutBuffer(param, dtype, last_micro_batch)) {
      slots_.Lend(param, grad);
      return true;
    }
    if (!slots_.MayLend(param, dtype, comm_.size(), last_micro_batch) || !shard_is_zero_[bucket]) return false;
    if (slots_.lent(param) != nullptr) return false;  // a second gradient: added to the first (Accumulate)
    ZERO_RETURN_IF_ERROR(BucketBuffer(bucket).status());  // taken first: its slots start unwritten
    if (slots_.written(param)) return false;
    slots_.Lend(param, grad);
    return true;
  }

  StatusOr<std::pair<BucketScheduler::Launch, BucketScheduler::Finish>> Reduction(
      int bucket, bool) override {
    const Bucket& b = plan_.buckets()[bucket];
    const void* lent_alone = slots_.LentFilling(bucket);
    if (lent_alone != nullptr && holder_[bucket] < 0) {
      // Lent without a buffer (several ranks, the step's first reduction of the bucket): its
      // whole gradient goes from the trainer's memory straight into the shard.
      shard_is_zero_[bucket] = false;
      char* own = static_cast<char*>(OwnedGrad(bucket));
      BucketScheduler::Launch launch = [this, lent_alone, own, &b] {
        return comm_.ReduceScatter(lent_alone, own, b.shard_numel, b.grad_dtype, comm::ReduceOp::kSum);
      };
      BucketScheduler::Finish finish = [this, bucket] {
        slots_.ReducedFilling(bucket);
        return absl::OkStatus();
      };
      return std::make_pair(std::move(launch), std::move(finish));
    }
    ZERO_ASSIGN_OR_RETURN(char* base, BucketBuffer(bucket));
    ZERO_RETURN_IF_ERROR(slots_.ZeroUnwritten(bucket, base, ops_));  // a bucket nobody wrote: zeros
    // The first reduction of a bucket since Zero() writes its sum straight into the shard;
    // later micro-batches reduce in place and add their chunk, after the collective.
    const bool first = shard_is_zero_[bucket];
    shard_is_zero_[bucket] = false;
    const bool alone = comm_.size() == 1;  // the reduction is the bucket itself: no collective
    char* own = first && !alone ? static_cast<char*>(OwnedGrad(bucket)) : base + b.grad_shard_byte_offset(comm_.rank());
    // Lent only on the first reduction (Lend), so its sum goes straight into the shard.
    const void* lent = alone ? nullptr : slots_.LentFilling(bucket);
    const void* source = lent != nullptr ? lent : base;
    BucketScheduler::Launch launch;
    if (!alone) {
      launch = [this, source, own, &b] {
        return comm_.ReduceScatter(source, own, b.shard_numel, b.grad_dtype, comm::ReduceOp::kSum);
      };
    }
    BucketScheduler::Finish finish = [this, bucket, own, first, alone, lent, &b] {
      if (lent != nullptr) slots_.ReducedFilling(bucket);
      // Queued on the device before any later reuse of the pool buffer.
      Status added = !first  ? ops_.AddInto(OwnedGrad(bucket), own, b.shard_numel, b.grad_dtype)
                     : alone ? CopyAllButLent(bucket, own)
                             : absl::OkStatus();
      free_.push_back(holder_[bucket]);
      holder_[bucket] = -1;
      return added;
    };
    return std::make_pair(std::move(launch), std::move(finish));
  }

  void* OwnedGrad(int bucket) override { return shard_.as<char>() + plan_.buckets()[bucket].grad_shard_offset; }

  bool NeedsBufferWait(int bucket) const override { return holder_[bucket] < 0 && free_.empty(); }
  bool ReducesWithoutBuffer(int bucket) const override {
    return holder_[bucket] < 0 && slots_.LentFilling(bucket) != nullptr;
  }
  bool LendsWithoutBuffer(int param, DType dtype, bool last_micro_batch) const override {
    const int bucket = plan_.placement(param).bucket;
    return comm_.size() > 1 && holder_[bucket] < 0 && shard_is_zero_[bucket] && slots_.lent(param) == nullptr &&
           slots_.MayLend(param, dtype, comm_.size(), last_micro_batch);
  }

  int pool_buffers() const override { return static_cast<int>(pool_.size()); }
  const void* LentGrad(int param) const override { return slots_.lent(param); }
  bool any_lent() const override { return slots_.any_lent(); }
  Status TakeBack(int param) override {
    if (slots_.lent(param) == nullptr) return absl::OkStatus();
    const int bucket = plan_.placement(param).bucket;
    if (comm_.size() == 1 && holder_[bucket] < 0 && !shard_is_zero_[bucket]) {  // already reduced: into the shard
      char* at = static_cast<char*>(OwnedGrad(bucket)) + plan_.ParamGradByteOffset(param);
      return slots_.TakeBackLent(param, at, ops_);
    }
    StatusOr<char*> slot = Slot(param);
    if (!slot.ok()) {
      slots_.Unlend(param);
      return slot.status();
    }
    return slots_.TakeBackLent(param, *slot, ops_);
  }

  // The shard is not cleared here: every bucket's first reduction since Zero overwrites its
  // part (shard_is_zero_), and ZeroUnreduced clears what a step would read unwritten.
  Status Zero() override {
    shard_is_zero_.assign(shard_is_zero_.size(), true);
    slots_.ForgetLent();
    return absl::OkStatus();
  }

  Status ZeroUnreduced() override {
    for (const Bucket& b : plan_.buckets()) {
      if (!b.trainable || !shard_is_zero_[b.index]) continue;
      ZERO_RETURN_IF_ERROR(ops_.Zero(OwnedGrad(b.index), b.grad_shard_bytes()));
    }
    return absl::OkStatus();
  }

 private:
  // One rank: the bucket's gradient at `own` into the shard, but for the lent params' parts.
  Status CopyAllButLent(int bucket, const char* own) {
    const int64_t element = plan_.buckets()[bucket].grad_element_bytes();
    char* shard = static_cast<char*>(OwnedGrad(bucket));
    return slots_.ForRunsBetween(bucket, [this](int p) { return slots_.lent(p) != nullptr; },
                                 [&](int64_t begin, int64_t end) {
                                   return ops_.CopyOnDevice(shard + begin * element, own + begin * element,
                                                            (end - begin) * element);
                                 });
  }
  // The pool buffer holding `bucket` this micro-batch, taking one if needed (its slots then
  // start unwritten).
  StatusOr<char*> BucketBuffer(int bucket) {
    if (holder_[bucket] < 0) {
      if (free_.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "no free gradient buffer for bucket ", bucket, " (NeedsBufferWait was not honoured)"));
      }
      holder_[bucket] = free_.back();
      free_.pop_back();
      slots_.Reset(bucket);
    }
    return pool_[holder_[bucket]].as<char>();
  }
  StatusOr<char*> Slot(int param) {
    ZERO_ASSIGN_OR_RETURN(char* base, BucketBuffer(plan_.placement(param).bucket));
    return base + plan_.ParamGradByteOffset(param);
  }

  const partition::PartitionPlan& plan_;
  comm::Communicator& comm_;
  DeviceOps& ops_;
  base::Allocator allocator_;  // for buffers added to the pool (AddPoolBuffer)
  int trainable_buckets_ = 0;
  int64_t largest_bucket_bytes_ = 0;  // every pool buffer holds the largest bucket
  base::Buffer shard_;  // one gradient shard of every trainable bucket (Bucket::grad_shard_offset)
  std::vector<base::Buffer> pool_;
  std::vector<int> holder_;  // pool buffer index per bucket this micro-batch, or -1
  std::vector<int> free_;
  std::vector<bool> shard_is_zero_;  // per bucket: no reduction since Zero()
  GradSlots slots_;
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
    ZERO_RETURN_IF_ERROR(ops.Zero(buffer.data(), buffer.bytes()));
    store.reset(new FullGradStore(plan, comm, ops, std::move(buffer)));
    return store;
  }
  ZERO_ASSIGN_OR_RETURN(base::Buffer shard,
                        allocator.Allocate(plan.grad_shards_bytes(), MemoryCategory::kGrads, ops.placement()));
  ZERO_RETURN_IF_ERROR(ops.Zero(shard.data(), shard.bytes()));
  auto sharded = std::make_unique<ShardedGradStore>(plan, comm, ops, allocator, std::move(shard),
                                                    std::vector<base::Buffer>());
  while (sharded->pool_buffers() < std::min(pool_buffers, sharded->trainable_buckets())) {
    ZERO_RETURN_IF_ERROR(sharded->AddPoolBuffer());
  }
  store = std::move(sharded);
  return store;
}

}  // namespace zero::runtime
