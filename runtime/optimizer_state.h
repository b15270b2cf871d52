// The rank's optimizer state and the fused step over it (internal to runtime).
//
// The rank steps an owned range of every trainable bucket: the whole bucket at stage 0, its
// shard otherwise. For fp32 buckets the fp32 weights are the params themselves; 16-bit buckets
// get an fp32 master copy of the owned range. Moments are concatenated over the owned ranges
// (the rank's optimizer state, DESIGN.md). Ranges are grouped by (optimizer group, dtype) into
// segment lists so each kernel launch sees few, long segments.
#ifndef ZERO_RUNTIME_OPTIMIZER_STATE_H_
#define ZERO_RUNTIME_OPTIMIZER_STATE_H_

#include <functional>
#include <vector>

#include "kernels/cpu/cpu_exec.h"
#include "kernels/segments.h"
#include "partition/partition_plan.h"
#include "runtime/base/allocator.h"
#include "runtime/grad_store.h"
#include "zero/config.h"

namespace zero::runtime {

class OptimizerState {
 public:
  /// Where the rank's owned params of a bucket start (the whole bucket at stage 0, its shard
  /// otherwise), wherever the stage keeps them.
  using OwnedParams = std::function<char*(int bucket)>;
  /// Sums a float vector over all ranks in place (LAMB's per-param norms); null when the rank
  /// owns whole params already (stage 0).
  using SumOverRanks = std::function<Status(std::vector<float>&)>;

  /// Allocates masters, moments and norm workspace for the rank's owned ranges; `grads` gives
  /// each bucket's owned gradient.
  static StatusOr<std::unique_ptr<OptimizerState>> Create(const Config& config,
                                                          const partition::PartitionPlan& plan,
                                                          int rank, const OwnedParams& params,
                                                          GradStore& grads,
                                                          base::Allocator& allocator,
                                                          const kernels::CpuExec& exec,
                                                          SumOverRanks sum_over_ranks);

  /// Copies the params' current values of `param`'s owned part into the fp32 master.
  void RefreshMaster(int param);
  /// Sum of squares (float64) of the rank's shard of the gradients (sum over ranks for the
  /// global value), and whether any element is Inf/NaN.
  StatusOr<kernels::NormResult> GradNorm();
  /// One optimizer step over the owned ranges (step ≥ 1), gradients multiplied by grad_scale.
  Status Step(int64_t step, float grad_scale);
  /// The fp32 weights and moments of `param`'s owned part, to put back with RestoreOwned (so
  /// that a step leaves a param untouched, as PyTorch skips params without a gradient).
  std::vector<float> SaveOwned(int param) const;
  /// Puts back what SaveOwned returned, and the bf16/fp16 model copy rounded from it.
  void RestoreOwned(int param, const std::vector<float>& saved);

  /// The rank's owned parts of `param` in param coordinates, for checkpoints: fn(param_begin,
  /// numel, master, state0, state1) with null states where the optimizer keeps none.
  void ForEachOwnedPart(int param, const std::function<void(int64_t, int64_t, float*, float*, float*)>& fn);
  /// Number of moment buffers the optimizer keeps (0, 1 or 2).
  int state_count() const { return (state0_.bytes() > 0 ? 1 : 0) + (state1_.bytes() > 0 ? 1 : 0); }
  /// Rewrites the bf16/fp16 model copy of `param`'s owned part from the fp32 master.
  void RoundModelCopy(int param);

 private:
  struct OwnedRange {
    int bucket;
    int64_t begin;  // within the bucket
    int64_t numel;
    float* master;
    int64_t state_begin;  // within state0_/state1_
    char* params;         // the owned params (element `begin` of the bucket)
  };
  // Calls fn(range, first, end) for the part [first, end) (bucket coordinates) of `param`
  // inside each owned range.
  template <typename Fn>
  void ForOwnedPart(int param, Fn fn) const;
  struct Batch {  // one kernel launch: segments of one group and dtype
    int group;
    kernels::SegmentTypes types;
    std::vector<kernels::Segment> segments;
    // The gradient of the rank's shard of each bucket (at stage 0 a sub-range of the owned
    // whole bucket): every stage takes the norm over the same spans, then sums over ranks, so
    // stages 0, 1 and 2 produce bit-identical norms.
    std::vector<kernels::ConstSpan> norm_spans;
  };
  // LAMB needs a trust ratio per param, so its segments are cut per param fragment.
  struct LambBatch {
    kernels::SegmentTypes types;
    std::vector<kernels::Segment> segments;
    std::vector<int> param_of;       // per segment
    std::vector<float*> updates;     // per segment, into lamb_updates_
  };
  Status BuildLambBatches(const std::vector<kernels::Segment>& range_segments);
  Status LambStep(int64_t step, float grad_scale);

  OptimizerState(const Config& config, const partition::PartitionPlan& plan,
                 const kernels::CpuExec& exec)
      : config_(config), plan_(plan), exec_(exec) {}

  const Config config_;
  const partition::PartitionPlan& plan_;
  const kernels::CpuExec exec_;
  std::vector<OwnedRange> ranges_;
  std::vector<Batch> batches_;
  base::Buffer master_, state0_, state1_, workspace_;
  size_t workspace_bytes_ = 0;
  SumOverRanks sum_over_ranks_;
  std::vector<LambBatch> lamb_batches_;
  base::Buffer lamb_updates_;  // the update direction between LAMB's two passes
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_OPTIMIZER_STATE_H_
