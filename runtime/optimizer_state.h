// The rank's optimizer state and the fused step over it (internal to runtime).
//
// The rank steps an owned range of every trainable bucket: the whole bucket at stage 0, its
// shard otherwise. For fp32 buckets the fp32 weights are the params themselves; 16-bit buckets
// get an fp32 master copy of the owned range. Moments are concatenated over the owned ranges
// (the rank's optimizer state, DESIGN.md). Ranges are grouped by (optimizer group, dtype) into
// segment lists so each kernel launch sees few, long segments; the kernels read each gradient
// in its bucket's gradient dtype (kernels::SegmentTypes{param dtype, gradient dtype}). Everything lives on the engine's
// device and is touched only through DeviceOps.
#ifndef ZERO_RUNTIME_OPTIMIZER_STATE_H_
#define ZERO_RUNTIME_OPTIMIZER_STATE_H_

#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "kernels/segments.h"
#include "partition/partition_plan.h"
#include "base/allocator.h"
#include "runtime/device_ops.h"
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

  /// Allocates masters and moments (zeroed) for the rank's owned ranges on the ops' device;
  /// `grads` gives each bucket's owned gradient.
  static StatusOr<std::unique_ptr<OptimizerState>> Create(const Config& config,
                                                          const partition::PartitionPlan& plan,
                                                          int rank, const OwnedParams& params,
                                                          GradStore& grads,
                                                          base::Allocator& allocator, DeviceOps& ops,
                                                          SumOverRanks sum_over_ranks);

  /// Copies the params' current values of `param`'s owned part into the fp32 master.
  Status RefreshMaster(int param);
  /// Sum of squares of the rank's shard of the gradients (sum over ranks for the global value)
  /// into `*sq_norm`, on the ops' device (DeviceOps::SquaredNormOnDevice): not finite when an
  /// element is Inf/NaN.
  Status GradSquaredNorm(float* sq_norm);
  /// One optimizer step over the owned ranges with `common`'s gradient scale (a value, or
  /// memory of the ops' device read as the kernels run: StepCommon::grad_scale_at): each
  /// optimizer group with its hyperparameters `groups[g]`, each param with its own step count
  /// `param_steps[p]` (this step included; a count of 0 steps as 1, for a param put back after
  /// the step). A group's params that agree on the count take one launch over the group's
  /// long segments; once guard.on_unused = "zero" has left a param untouched the counts differ
  /// for good, and the group takes one launch per distinct count over per-param segments.
  /// With `sq_norm` (memory of the ops' device; only where squares_in_step()), the same sum
  /// of squares into it too, summed by the step's own kernels as they read the gradients: in a
  /// fixed order, so the same on every run, but not always bit-identical to GradSquaredNorm's
  /// (several groups or per-param launches cut the partial sums differently).
  Status Step(const std::vector<OptimizerHyper>& groups, const std::vector<int64_t>& param_steps,
              const kernels::StepCommon& common, float* sq_norm);
  /// Whether Step can sum the gradients' squares as it steps: the ops' kernels can
  /// (DeviceOps::squares_in_step), the rank steps its shard (not at stage 0 with several
  /// ranks, where each steps every bucket whole), and the optimizer is not LAMB.
  bool squares_in_step() const { return squares_.bytes() > 0; }
  /// A host copy of one part of a param this rank owns, in param coordinates: `numel` fp32
  /// weights followed by `numel` values of each moment buffer (state_count() of them).
  struct OwnedPart {
    int64_t begin = 0;
    int64_t numel = 0;
    std::vector<float> values;
  };
  /// The rank's owned parts of `param` (for checkpoints, and to put a param back untouched
  /// after a step, as PyTorch skips params without a gradient).
  StatusOr<std::vector<OwnedPart>> ReadOwned(int param) const;
  /// Each part of ReadOwned in turn, copied into `scratch` (its capacity reused, so saving a
  /// checkpoint touches no fresh memory per part): fn(begin, numel, values).
  Status VisitOwned(int param, std::vector<float>* scratch,
                    const std::function<Status(int64_t begin, int64_t numel, const float* values)>& fn) const;
  /// Each part of the reduced gradient of `param` that the rank steps, as Step reads it (the
  /// param's lent gradient where it has one), widened to fp32 into `scratch`: fn(begin,
  /// numel, values), `begin` in param coordinates. Valid where Step may run.
  Status VisitOwnedGrad(int param, std::vector<float>* scratch,
                        const std::function<Status(int64_t begin, int64_t numel, const float* values)>& fn) const;
  /// The (begin, numel) of each part ReadOwned returns, without reading anything.
  std::vector<std::pair<int64_t, int64_t>> OwnedExtents(int param) const;
  /// Writes back parts from ReadOwned (same begin and numel), and the bf16/fp16 model copy
  /// rounded from them.
  Status WriteOwned(int param, const std::vector<OwnedPart>& parts);
  /// SGD built without momentum (no group had any) keeps no momentum buffer: allocates it,
  /// zeroed, for a group whose momentum is turned on later. Nothing to do for other
  /// optimizers or once it exists.
  Status AddMomentumBuffer();
  /// Number of moment buffers the optimizer keeps (0, 1 or 2).
  int state_count() const { return (state0_.bytes() > 0 ? 1 : 0) + (state1_.bytes() > 0 ? 1 : 0); }

 private:
  struct OwnedRange {
    int bucket;
    int64_t begin;  // within the bucket
    int64_t numel;
    float* master;
    int64_t state_begin;  // within state0_/state1_
    char* params;         // the owned params (element `begin` of the bucket)
  };
  // Moment buffer `state` at element `at` of range `r`, or null when the optimizer keeps none.
  static float* StateAt(const base::Buffer& state, const OwnedRange& r, int64_t at) {
    return state.bytes() > 0 ? state.as<float>() + r.state_begin + at : nullptr;
  }
  // Calls fn(range, first, end) for the part [first, end) (bucket coordinates) of `param`
  // inside each owned range.
  template <typename Fn>
  void ForOwnedPart(int param, Fn fn) const;
  // Part of one param inside an owned range.
  struct Fragment {
    int param;
    kernels::Segment segment;
    int64_t param_begin;  // the fragment's first element within the param
    int64_t state_begin;  // the fragment's first element within state0_/state1_
  };
  struct Batch {  // one kernel launch: segments of one group and dtype
    int group;
    kernels::SegmentTypes types;
    std::vector<kernels::Segment> segments;
    std::vector<int64_t> segment_state_begins;  // each segment's first element within state0_/state1_
    // The same elements cut per param (padding left out), for steps whose params' counts differ.
    std::vector<Fragment> fragments;
    // The gradient of the rank's shard of each bucket (at stage 0 a sub-range of the owned
    // whole bucket): every stage takes the norm over the same spans, then sums over ranks, so
    // stages 0, 1 and 2 produce bit-identical norms.
    std::vector<kernels::ConstSpan> norm_spans;
  };
  // Calls fn(param, fragment, at) for each param's part of range `r`, whose whole segment is
  // `whole`; `at` is the fragment's first element within the range.
  template <typename Fn>
  void CutPerParam(const OwnedRange& r, const kernels::Segment& whole, Fn fn) const;
  // LAMB's update direction for fragment `f`, in lamb_updates_ (laid out as state0_).
  float* LambUpdateOf(const Fragment& f) const {
    return lamb_updates_.as<float>() + (f.segment.state0 - state0_.as<float>());
  }
  // `segment`, the part of `param` from its element `param_begin` on, reading the param's lent
  // gradient (GradStore::Lend) where it has one this step.
  kernels::Segment WithLentGrad(int param, int64_t param_begin, kernels::Segment segment) const;
  // One launch of the group's optimizer over `segments`, all at step count `step`.
  Status Launch(const OptimizerHyper& hyper, int64_t step, const kernels::StepCommon& common,
                kernels::SegmentTypes types, const std::vector<kernels::Segment>& segments);
  Status LambStep(const std::vector<OptimizerHyper>& groups, const std::vector<int64_t>& param_steps,
                  const kernels::StepCommon& common);

  // Rewrites the bf16/fp16 model copy of `param`'s owned part from the fp32 master.
  Status RoundModelCopy(int param);

  OptimizerState(const Config& config, const partition::PartitionPlan& plan, GradStore& grads, DeviceOps& ops,
                 base::Allocator allocator)
      : config_(config), plan_(plan), grads_(grads), ops_(ops), allocator_(std::move(allocator)) {}

  const Config config_;
  const partition::PartitionPlan& plan_;
  GradStore& grads_;
  DeviceOps& ops_;
  base::Allocator allocator_;  // for a momentum buffer added later (AddMomentumBuffer)
  std::vector<OwnedRange> ranges_;
  std::vector<Batch> batches_;
  base::Buffer master_, state0_, state1_;
  SumOverRanks sum_over_ranks_;
  base::Buffer lamb_updates_;  // the update direction between LAMB's two passes
  base::Buffer squares_;       // the step's squared-gradient partials (empty: not summed in the step)
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_OPTIMIZER_STATE_H_
