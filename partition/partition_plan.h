// PartitionPlan: where every byte of every parameter lives, for every stage. Pure host
// arithmetic — no tensors are allocated here.
//
// Trainable params are laid out in reverse registration order (the order backward produces
// their gradients) into buckets. A bucket holds whole params of one optimizer group and one
// dtype; a param larger than the bucket cap gets a bucket of its own, with the small params laid
// out just before it (up to 1/16 of the cap: its bias); at stage 3 a bucket is
// one unit (the params the trainer gathers together). Param starts are aligned to 64 elements
// and each bucket is padded to a multiple of world × 128 elements. Each bucket is cut into
// `world` equal contiguous shards; rank r owns shard r of every bucket. Frozen params
// (requires_grad = false) are laid out the same way in buckets of their own, never reduced or
// stepped.
//
// Gradients have a layout of their own next to the params': each trainable bucket has a
// gradient dtype (GradientDType: the params' own, or fp32 for 16-bit params accumulating in
// fp32), and its gradient bytes, offsets and shards are counted in that dtype; element offsets
// (placements, fragments, owned spans) are the same for both. Frozen buckets have no gradient.
//
// A rank's optimizer state is the concatenation of its shards of the trainable buckets, in
// bucket order. A Fragment is the part of one param one rank owns, in four coordinates.
#ifndef ZERO_PARTITION_PARTITION_PLAN_H_
#define ZERO_PARTITION_PARTITION_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "zero/dtype.h"
#include "zero/status.h"

namespace zero::partition {

/// What the plan needs to know of a registered param. Ids are registration indices.
struct ParamInfo {
  std::string name;
  int64_t numel = 0;
  DType dtype = DType::kFP32;
  bool requires_grad = true;
  int group = 0;  ///< optimizer group
  int unit = -1;  ///< stage-3 unit; -1: a unit of its own
};

/// The dtype a trainable param of dtype `param` accumulates and reduces its gradient in, given
/// precision.grad = `grad`: the param's own when `grad` equals it, fp32 when `grad` is fp32.
/// Any other pair (fp32 params with 16-bit gradients, bf16 params with fp16 ones) is
/// kUnimplemented, saying which pairs are implemented; callers add the param's name.
StatusOr<DType> GradientDType(DType param, DType grad);

/// Layout settings.
struct PlanConfig {
  int world_size = 1;
  int stage = 0;
  DType grad = DType::kFP32;                 ///< precision.grad (GradientDType)
  int64_t reduce_bucket_elems = 4'000'000;   ///< cap of every bucket but the first
  int64_t first_bucket_elems = 1'000'000;    ///< cap of the first bucket (the first to fill)
  int64_t last_bucket_elems = 1'000'000;     ///< cap of the last trainable bucket (the last to
                                             ///< fill; stages 0-2); 0: no cap of its own
  int64_t param_alignment = 64;              ///< param starts, in elements
  int64_t shard_alignment = 128;             ///< bucket size is a multiple of world × this
};

/// One bucket: whole params, one group, one dtype, trainable or frozen. The param layout
/// (dtype, byte_offset, bytes(), shard_bytes(), ...) and the gradient layout (grad_*) share
/// the element counts and differ in element size.
struct Bucket {
  int index = 0;
  int group = 0;
  DType dtype = DType::kFP32;       ///< the params'
  DType grad_dtype = DType::kFP32;  ///< the gradients' (trainable buckets; frozen: = dtype)
  bool trainable = true;
  int unit = -1;              ///< stage 3: the unit this bucket is; -1 otherwise
  std::vector<int> params;    ///< ids, in layout order
  int64_t numel = 0;          ///< padded size
  int64_t shard_numel = 0;    ///< numel / world
  int64_t byte_offset = 0;    ///< start within the flat parameter buffer (all dtypes share it)
  int64_t state_offset = 0;   ///< start of every rank's shard within its optimizer state
                              ///< (trainable buckets only)
  int64_t grad_byte_offset = -1;   ///< start within the flat gradient buffer holding every
                                   ///< trainable bucket unsharded; -1 for frozen buckets
  int64_t grad_shard_offset = -1;  ///< start of the bucket's gradient shard within a buffer
                                   ///< holding one gradient shard of every trainable bucket
                                   ///< back to back; -1 for frozen buckets

  /// Bytes of one param element.
  int64_t element_bytes() const { return static_cast<int64_t>(DTypeSize(dtype)); }
  /// Bytes of the whole (padded) bucket's params.
  int64_t bytes() const { return numel * element_bytes(); }
  /// Bytes of one rank's shard of the params.
  int64_t shard_bytes() const { return shard_numel * element_bytes(); }
  /// Where rank `rank`'s shard starts within the bucket's params, in bytes.
  int64_t shard_byte_offset(int rank) const { return rank * shard_bytes(); }

  /// Bytes of one gradient element.
  int64_t grad_element_bytes() const { return static_cast<int64_t>(DTypeSize(grad_dtype)); }
  /// Bytes of the whole (padded) bucket's gradient.
  int64_t grad_bytes() const { return numel * grad_element_bytes(); }
  /// Bytes of one rank's shard of the gradient.
  int64_t grad_shard_bytes() const { return shard_numel * grad_element_bytes(); }
  /// Where rank `rank`'s shard starts within the bucket's gradient, in bytes.
  int64_t grad_shard_byte_offset(int rank) const { return rank * grad_shard_bytes(); }
};

/// Where one param sits.
struct ParamPlacement {
  int bucket = 0;
  int64_t offset = 0;  ///< element offset within the bucket
  int64_t numel = 0;
};

/// The elements of one bucket that one rank updates in its optimizer step.
struct OwnedSpan {
  int64_t begin = 0;  ///< first element within the bucket
  int64_t numel = 0;
};

/// The part of one param that one rank owns.
struct Fragment {
  int param = 0;
  int rank = 0;
  int bucket = 0;
  int64_t param_begin = 0;   ///< first element within the param
  int64_t numel = 0;
  int64_t bucket_begin = 0;  ///< first element within the bucket
  int64_t shard_begin = 0;   ///< first element within the rank's shard of the bucket
  int64_t state_begin = 0;   ///< first element within the rank's optimizer state (trainable)
};

class PartitionPlan {
 public:
  /// Builds the plan. Errors name the offending param: empty name, numel < 1, a stage-3 unit
  /// whose params differ in group, dtype or requires_grad, a trainable param whose dtype has no
  /// gradient dtype under config.grad (GradientDType). Configuration errors name the field.
  static StatusOr<PartitionPlan> Build(std::vector<ParamInfo> params, const PlanConfig& config);

  const PlanConfig& config() const { return config_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ParamPlacement& placement(int param) const { return placements_[param]; }

  /// Whether ranks own disjoint shards (stages 1-3). At stage 0 every rank holds, and steps,
  /// a whole replica of every bucket.
  bool ranks_own_shards() const { return config_.stage != 0; }
  /// What `rank` steps of `bucket`: its shard, or the whole bucket at stage 0.
  OwnedSpan Owned(int bucket, int rank) const {
    const Bucket& b = buckets_[bucket];
    if (!ranks_own_shards()) return {0, b.numel};
    return {rank * b.shard_numel, b.shard_numel};
  }

  /// The fragments of `param`, one per rank that owns part of it, in rank order.
  std::vector<Fragment> FragmentsOfParam(int param) const;
  /// Every fragment `rank` owns, in optimizer-state order.
  std::vector<Fragment> FragmentsOnRank(int rank) const;

  /// Elements of each rank's optimizer state (the same on every rank).
  int64_t state_numel() const { return state_numel_; }
  /// Bytes of the flat parameter buffer holding every bucket unsharded.
  int64_t flat_bytes() const { return flat_bytes_; }
  /// Bytes of the flat gradient buffer holding every trainable bucket unsharded (stages 0-1).
  int64_t grad_flat_bytes() const { return grad_flat_bytes_; }
  /// Bytes of a buffer holding one gradient shard of every trainable bucket (stages 2-3).
  int64_t grad_shards_bytes() const { return grad_shards_bytes_; }
  /// Bytes of `param`'s values.
  int64_t ParamBytes(int param) const {
    return placements_[param].numel * buckets_[placements_[param].bucket].element_bytes();
  }
  /// Where `param`'s first element sits within its bucket, in bytes.
  int64_t ParamByteOffset(int param) const {
    return placements_[param].offset * buckets_[placements_[param].bucket].element_bytes();
  }
  /// Bytes of `param`'s gradient (trainable params).
  int64_t ParamGradBytes(int param) const {
    return placements_[param].numel * buckets_[placements_[param].bucket].grad_element_bytes();
  }
  /// Where `param`'s first gradient element sits within its bucket's gradient, in bytes.
  int64_t ParamGradByteOffset(int param) const {
    return placements_[param].offset * buckets_[placements_[param].bucket].grad_element_bytes();
  }
  /// A buffer holding one param shard of each bucket back to back (stage 3 param shards; the
  /// gradient shards are laid out by Bucket::grad_shard_offset): each bucket's byte offset in
  /// it (-1 for frozen buckets when `trainable_only`), and the buffer's size in `*total_bytes`.
  std::vector<int64_t> CompactShardOffsets(bool trainable_only, int64_t* total_bytes) const;

 private:
  PlanConfig config_;
  std::vector<ParamInfo> params_;
  std::vector<Bucket> buckets_;
  std::vector<ParamPlacement> placements_;
  int64_t state_numel_ = 0;
  int64_t flat_bytes_ = 0;
  int64_t grad_flat_bytes_ = 0;
  int64_t grad_shards_bytes_ = 0;
};

}  // namespace zero::partition

#endif  // ZERO_PARTITION_PARTITION_PLAN_H_
