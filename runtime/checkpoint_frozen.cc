// Frozen params in checkpoints (checkpoint.save_frozen): which parts of a frozen param each
// rank writes and reads, and their values moved between the param store (in the param's dtype)
// and the fp32 weights of a record. The records themselves are checkpoint.cc's.
//
//   saving   stage 3: each rank its shard; stages 1-2: each rank its fragments of the replica
//            it holds (the ranks together write each element once); stage 0: rank 0 all
//   loading  stage 3: each rank its shard; stages 0-2: every rank the whole param, since each
//            keeps a whole replica and a step gathers trainable buckets only
#include "kernels/cpu/elementwise.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {

std::vector<std::pair<int64_t, int64_t>> EngineImpl::FrozenParts(int param, bool loading) const {
  const int64_t numel = plan_->placement(param).numel;
  if (!params_->holds_replicas() || (!loading && plan_->ranks_own_shards())) {
    std::vector<std::pair<int64_t, int64_t>> parts;
    for (const partition::Fragment& f : plan_->FragmentsOfParam(param)) {
      if (f.rank == comm_.rank()) parts.emplace_back(f.param_begin, f.numel);
    }
    return parts;
  }
  return {{0, numel}};
}

char* EngineImpl::FrozenAddress(int param, int64_t begin) {
  const partition::ParamPlacement& place = plan_->placement(param);
  const partition::Bucket& bucket = plan_->buckets()[place.bucket];
  if (params_->holds_replicas()) return static_cast<char*>(params_->View(param)) + begin * bucket.element_bytes();
  // Stage 3: within this rank's shard of the bucket (FrozenParts gives only elements it owns).
  const int64_t in_shard = place.offset + begin - comm_.rank() * bucket.shard_numel;
  return params_->Owned(place.bucket) + in_shard * bucket.element_bytes();
}

Status EngineImpl::ReadFrozenValues(int param, int64_t begin, int64_t numel, std::vector<char>* staging,
                                    std::vector<float>* out) {
  const partition::Bucket& bucket = plan_->buckets()[plan_->placement(param).bucket];
  staging->resize(static_cast<size_t>(numel * bucket.element_bytes()));
  out->resize(static_cast<size_t>(numel));
  if (numel == 0) return absl::OkStatus();
  ZERO_RETURN_IF_ERROR(ops_->Copy(staging->data(), FrozenAddress(param, begin), numel * bucket.element_bytes()));
  kernels::WidenCpu(out->data(), staging->data(), numel, bucket.dtype);
  return absl::OkStatus();
}

Status EngineImpl::WriteFrozenValues(int param, const FrozenPart& part) {
  if (part.numel == 0) return absl::OkStatus();
  return ops_->Copy(FrozenAddress(param, part.begin), part.bytes.data(), static_cast<int64_t>(part.bytes.size()));
}

void EngineImpl::NarrowIntoFrozenPart(int param, const float* values, int64_t begin, int64_t numel,
                                      FrozenPart* part) const {
  const partition::Bucket& bucket = plan_->buckets()[plan_->placement(param).bucket];
  if (part->bytes.empty()) part->bytes.resize(static_cast<size_t>(part->numel * bucket.element_bytes()));
  kernels::NarrowCpu(part->bytes.data() + (begin - part->begin) * bucket.element_bytes(), values, numel,
                     bucket.dtype);
}

}  // namespace zero::runtime
