// Stages 0-2: every rank holds every param; stages 1-2 all-gather the updated shards.
#include "absl/strings/str_cat.h"
#include "runtime/param_store.h"
#include "runtime/replica_hash.h"

namespace zero::runtime {
namespace {

Status StageThreeOnly(const char* call) {
  return absl::FailedPreconditionError(absl::StrCat(
      call, " is for stage 3, where units are gathered; at stages 0-2 every param is held whole (ParamData)"));
}

class ReplicatedParams final : public ParamStore {
 public:
  ReplicatedParams(const Context& context, base::Buffer params)
      : plan_(context.plan), path_(context.path), ops_(context.ops), params_(std::move(params)),
        hasher_(context.ops, context.allocator) {}

  bool holds_replicas() const override { return true; }

  char* Owned(int bucket) override {
    const partition::Bucket& b = plan_.buckets()[bucket];
    return params_.as<char>() + b.byte_offset + plan_.Owned(bucket, path_.comm().rank()).begin * b.element_bytes();
  }

  Status Set(int param, const void* values) override {
    return ops_.Copy(Address(param), values, plan_.ParamBytes(param));
  }

  Status Get(int param, void* out) override { return ops_.Copy(out, Address(param), plan_.ParamBytes(param)); }

  void* View(int param) override { return Address(param); }

  Status Gather(int) override { return absl::OkStatus(); }
  Status Release(int, bool) override { return absl::OkStatus(); }
  StatusOr<GatheredPlace> Place(int) const override { return StageThreeOnly("GatheredPlaceOf"); }
  Status Lend(GatheredMemoryLender) override { return StageThreeOnly("LendGatheredMemory"); }

  Status AfterStep(bool updated) override {
    // At world size 1 the shard is the bucket: gathering it in place changes nothing.
    if (!updated || !plan_.ranks_own_shards() || path_.comm().size() == 1) return absl::OkStatus();
    std::vector<comm::WorkPtr> works;
    for (const partition::Bucket& b : plan_.buckets()) {
      if (!b.trainable) continue;
      char* base = params_.as<char>() + b.byte_offset;
      char* own = base + b.shard_byte_offset(path_.comm().rank());
      works.push_back(path_.Start([&](comm::Communicator& comm) {
        return comm.AllGather(own, base, b.shard_numel, b.dtype);
      }));
    }
    for (comm::WorkPtr& work : works) {
      ZERO_RETURN_IF_ERROR(path_.WaitOnStream(work, [] { return std::string("gathering updated params"); }));
    }
    return absl::OkStatus();
  }

  Status AfterLoad() override { return AfterStep(true); }

  StatusOr<uint64_t> ReplicaHash(int param) override { return hasher_.Hash(Address(param), plan_.ParamBytes(param)); }

  Status BroadcastFromRank0(int param) override {
    if (path_.comm().size() == 1) return absl::OkStatus();  // rank 0's values are here
    const partition::Bucket& b = plan_.buckets()[plan_.placement(param).bucket];
    return path_.Run([&](comm::Communicator& comm) {
      return comm.Broadcast(Address(param), plan_.placement(param).numel, b.dtype, 0);
    }, absl::StrCat("broadcasting rank 0's values of \"", plan_.params()[param].name, "\" (index ", param, ")"));
  }

  // None outlives a call here; the gathers the stream waits for, CollectivePath keeps.
  Status WaitForCollectives() override { return absl::OkStatus(); }

 private:
  char* Address(int param) const {
    return params_.as<char>() + plan_.buckets()[plan_.placement(param).bucket].byte_offset + plan_.ParamByteOffset(param);
  }

  const partition::PartitionPlan& plan_;
  CollectivePath& path_;
  DeviceOps& ops_;
  base::Buffer params_;
  ReplicaHasher hasher_;
};

}  // namespace

StatusOr<std::unique_ptr<ParamStore>> CreateReplicatedParams(const ParamStore::Context& context) {
  base::Allocator allocator = context.allocator;
  ZERO_ASSIGN_OR_RETURN(base::Buffer params,
                        allocator.Allocate(context.plan.flat_bytes(), MemoryCategory::kParams, context.ops.placement()));
  ZERO_RETURN_IF_ERROR(context.ops.Zero(params.data(), params.bytes()));
  return std::unique_ptr<ParamStore>(new ReplicatedParams(context, std::move(params)));
}

}  // namespace zero::runtime
