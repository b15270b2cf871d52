// Building the partition plan and answering where each param's fragments live.
#include "partition/partition_plan.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"

namespace zero::partition {
namespace {

int64_t RoundUp(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

Status CheckConfig(const PlanConfig& c) {
  auto bad = [](const char* key, int64_t value, const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat(key, " = ", value, ": ", rule));
  };
  if (c.world_size < 1) return bad("world_size", c.world_size, "must be ≥ 1");
  if (c.stage < 0 || c.stage > 3) return bad("stage", c.stage, "must be 0, 1, 2 or 3");
  if (c.reduce_bucket_elems < 1) return bad("buckets.reduce_bucket_elems", c.reduce_bucket_elems, "must be ≥ 1");
  if (c.first_bucket_elems < 1) return bad("buckets.first_bucket_elems", c.first_bucket_elems, "must be ≥ 1");
  if (c.last_bucket_elems < 0) return bad("buckets.last_bucket_elems", c.last_bucket_elems, "must be ≥ 0");
  if (c.param_alignment < 1) return bad("param_alignment", c.param_alignment, "must be ≥ 1");
  if (c.shard_alignment < 1) return bad("shard_alignment", c.shard_alignment, "must be ≥ 1");
  return absl::OkStatus();
}

Status CheckParams(const std::vector<ParamInfo>& params, DType grad) {
  std::set<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    if (p.name.empty()) return absl::InvalidArgumentError(absl::StrCat("param ", i, " has an empty name"));
    if (p.numel < 1) {
      return absl::InvalidArgumentError(absl::StrCat("param \"", p.name, "\" (index ", i,
                                                     ") has ", p.numel, " elements; need ≥ 1"));
    }
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("param name \"", p.name, "\" (index ", i,
                                                     ") is registered twice; names must be unique"));
    }
    if (!p.requires_grad) continue;
    if (Status s = GradientDType(p.dtype, grad).status(); !s.ok()) {
      return Status(s.code(), absl::StrCat("param \"", p.name, "\" (index ", i, "): ", s.message()));
    }
  }
  return absl::OkStatus();
}

// Stages 0-2: the trainable params that make up the last trainable bucket, the one that fills
// last in backward and whose reduction is all that stays exposed after it: the trailing run of
// `order` (the first-registered params) of one group and dtype that fits last_bucket_elems,
// or the first-registered param's size plus a quarter when that is more: a param larger than
// the cap keeps its small companions (a layer's bias, a position embedding), whose gradients
// arrive with it, instead of leaving them to end the bucket before at the same moment. Sizes
// are counted rounded up to the param alignment, whatever order the bucket lays them out in.
// Empty when there is no such cap or when every trainable param fits (one bucket then, capped
// as usual).
std::set<int> LastBucketParams(const std::vector<ParamInfo>& params, const std::vector<int>& order,
                               const PlanConfig& c) {
  std::set<int> tail;
  if (c.last_bucket_elems == 0) return tail;
  int64_t used = 0, cap = c.last_bucket_elems;
  const ParamInfo* head = nullptr;
  size_t trainable = 0;
  for (int id : order) trainable += params[id].requires_grad ? 1 : 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const ParamInfo& p = params[*it];
    if (!p.requires_grad) continue;
    if (head == nullptr) {
      head = &p;
      cap = std::max(cap, p.numel + p.numel / 4);
    }
    const int64_t next = used + RoundUp(p.numel, c.param_alignment);
    if (p.group != head->group || p.dtype != head->dtype || (next > cap && !tail.empty())) break;
    tail.insert(*it);
    used = next;
  }
  if (tail.size() == trainable) tail.clear();
  return tail;
}

// The small params an oversized param takes into its bucket: at most cap / this many elements.
constexpr int64_t kCompanionFraction = 16;

// Groups param ids (already in layout order) into buckets' param lists.
std::vector<std::vector<int>> FormBuckets(const std::vector<ParamInfo>& params,
                                          const std::vector<int>& order, const PlanConfig& c) {
  std::vector<std::vector<int>> lists;
  if (c.stage == 3) {  // one bucket per unit, units in order of first appearance
    std::map<int, size_t> unit_list;
    for (int id : order) {
      const int unit = params[id].unit >= 0 ? params[id].unit : -1 - id;
      auto [it, fresh] = unit_list.emplace(unit, lists.size());
      if (fresh) lists.emplace_back();
      lists[it->second].push_back(id);
    }
    return lists;
  }
  // Stages 0-2: one open bucket for trainable params and one for frozen ones.
  const std::set<int> last_bucket = LastBucketParams(params, order, c);
  int open[2] = {-1, -1};
  int64_t used[2] = {0, 0};
  bool first_trainable = true;
  // Params that may share a bucket: one group, one dtype, both in the last bucket or neither.
  auto alike = [&](int a, int b) {
    return params[a].group == params[b].group && params[a].dtype == params[b].dtype &&
           last_bucket.count(a) == last_bucket.count(b);
  };
  for (int id : order) {
    const ParamInfo& p = params[id];
    const int kind = p.requires_grad ? 0 : 1;
    int& current = open[kind];
    const int64_t cap = (kind == 0 && first_trainable) ? c.first_bucket_elems : c.reduce_bucket_elems;
    const bool fits = current >= 0 && alike(lists[current].front(), id) &&
                      RoundUp(used[kind], c.param_alignment) + p.numel <= cap;
    if (!fits) {
      if (current >= 0 && kind == 0) first_trainable = false;
      // A param larger than the cap takes along the small params that end the open bucket
      // (up to cap / kCompanionFraction: a Linear's bias, laid out just before its weight,
      // whose gradient arrives with it) rather than leaving them a tiny bucket of their own.
      std::vector<int> companions;
      if (current >= 0 && p.numel > cap) {
        std::vector<int>& before = lists[current];
        int64_t taken = 0;
        while (!before.empty() && alike(before.back(), id) &&
               taken + RoundUp(params[before.back()].numel, c.param_alignment) <= cap / kCompanionFraction) {
          taken += RoundUp(params[before.back()].numel, c.param_alignment);
          companions.insert(companions.begin(), before.back());
          before.pop_back();
        }
      }
      if (current < 0 || !lists[current].empty()) {  // else the taken bucket becomes this one
        current = static_cast<int>(lists.size());
        lists.emplace_back();
      }
      used[kind] = 0;
      for (int companion : companions) {
        lists[current].push_back(companion);
        used[kind] = RoundUp(used[kind], c.param_alignment) + params[companion].numel;
      }
    }
    lists[current].push_back(id);
    used[kind] = RoundUp(used[kind], c.param_alignment) + p.numel;
  }
  return lists;
}

}  // namespace

StatusOr<DType> GradientDType(DType param, DType grad) {
  if (grad == param || grad == DType::kFP32) return grad;
  const std::string allowed = param == DType::kFP32 ? "fp32" : absl::StrCat(DTypeName(param), " or fp32");
  return absl::UnimplementedError(absl::StrCat(
      "its gradient cannot be kept in precision.grad = ", DTypeName(grad), " (", DTypeName(param),
      " params keep theirs in ", allowed, "); set precision.grad and precision.reduce to ", allowed));
}

StatusOr<PartitionPlan> PartitionPlan::Build(std::vector<ParamInfo> params, const PlanConfig& config) {
  ZERO_RETURN_IF_ERROR(CheckConfig(config));
  ZERO_RETURN_IF_ERROR(CheckParams(params, config.grad));
  PartitionPlan plan;
  plan.config_ = config;
  plan.params_ = std::move(params);
  plan.placements_.resize(plan.params_.size());

  std::vector<int> order(plan.params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(order.size() - 1 - i);

  const int64_t pad_multiple = config.world_size * config.shard_alignment;
  for (std::vector<int>& list : FormBuckets(plan.params_, order, config)) {
    Bucket bucket;
    bucket.index = static_cast<int>(plan.buckets_.size());
    const ParamInfo& head = plan.params_[list.front()];
    bucket.group = head.group;
    bucket.dtype = head.dtype;
    // CheckParams made sure that every trainable param has a gradient dtype.
    bucket.grad_dtype = head.requires_grad ? *GradientDType(head.dtype, config.grad) : head.dtype;
    bucket.trainable = head.requires_grad;
    bucket.unit = config.stage == 3 ? head.unit : -1;
    int64_t used = 0;
    for (int id : list) {
      const ParamInfo& p = plan.params_[id];
      if (p.group != head.group || p.dtype != head.dtype || p.requires_grad != head.requires_grad) {
        return absl::InvalidArgumentError(absl::StrCat(
            "stage-3 unit ", head.unit, " mixes params that cannot share a bucket: \"", head.name,
            "\" (group ", head.group, ", ", DTypeName(head.dtype), ", requires_grad ",
            head.requires_grad, ") and \"", p.name, "\" (group ", p.group, ", ", DTypeName(p.dtype),
            ", requires_grad ", p.requires_grad, "); put them in different units"));
      }
      used = RoundUp(used, config.param_alignment);
      plan.placements_[id] = {bucket.index, used, p.numel};
      used += p.numel;
    }
    bucket.params = std::move(list);
    bucket.numel = RoundUp(used, pad_multiple);
    bucket.shard_numel = bucket.numel / config.world_size;
    bucket.byte_offset = plan.flat_bytes_;
    plan.flat_bytes_ += bucket.numel * static_cast<int64_t>(DTypeSize(bucket.dtype));
    if (bucket.trainable) {
      bucket.state_offset = plan.state_numel_;
      plan.state_numel_ += bucket.shard_numel;
      bucket.grad_byte_offset = plan.grad_flat_bytes_;
      plan.grad_flat_bytes_ += bucket.grad_bytes();
      bucket.grad_shard_offset = plan.grad_shards_bytes_;
      plan.grad_shards_bytes_ += bucket.grad_shard_bytes();
    }
    plan.buckets_.push_back(std::move(bucket));
  }
  return plan;
}

std::vector<Fragment> PartitionPlan::FragmentsOfParam(int param) const {
  std::vector<Fragment> fragments;
  const ParamPlacement& place = placements_[param];
  const Bucket& bucket = buckets_[place.bucket];
  const int64_t shard = bucket.shard_numel;
  const int first_rank = static_cast<int>(place.offset / shard);
  const int last_rank = static_cast<int>((place.offset + place.numel - 1) / shard);
  for (int r = first_rank; r <= last_rank; ++r) {
    const int64_t begin = std::max(place.offset, r * shard);
    const int64_t end = std::min(place.offset + place.numel, (r + 1) * shard);
    Fragment f;
    f.param = param;
    f.rank = r;
    f.bucket = place.bucket;
    f.param_begin = begin - place.offset;
    f.numel = end - begin;
    f.bucket_begin = begin;
    f.shard_begin = begin - r * shard;
    f.state_begin = bucket.trainable ? bucket.state_offset + f.shard_begin : -1;
    fragments.push_back(f);
  }
  return fragments;
}

std::vector<Fragment> PartitionPlan::FragmentsOnRank(int rank) const {
  std::vector<Fragment> fragments;
  for (const Bucket& bucket : buckets_) {
    for (int param : bucket.params) {
      for (const Fragment& f : FragmentsOfParam(param)) {
        if (f.rank == rank) fragments.push_back(f);
      }
    }
  }
  return fragments;
}

std::vector<int64_t> PartitionPlan::CompactShardOffsets(bool trainable_only, int64_t* total_bytes) const {
  std::vector<int64_t> offsets(buckets_.size(), -1);
  int64_t bytes = 0;
  for (const Bucket& b : buckets_) {
    if (trainable_only && !b.trainable) continue;
    offsets[b.index] = bytes;
    bytes += b.shard_bytes();
  }
  *total_bytes = bytes;
  return offsets;
}

}  // namespace zero::partition
