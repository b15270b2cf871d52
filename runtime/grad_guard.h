// The gradient guard: every gradient reduced exactly once, or a clear error and a way out
// (DESIGN.md, "The gradient guard"). Internal to runtime; the engine consults it on every
// arrival and at EndBackward.
//
// Per micro-batch it tracks, per param, the number of arrivals, the position of the first, and
// whether the param is complete (its bucket may launch). O(1) per arrival, no allocation.
//
//   on_duplicate = error  a second arrival is DuplicateGradient, naming the param, bucket,
//                         iteration, both positions and the fixes; nothing is corrupted.
//   on_duplicate = count  the first micro-batch that gives a param gradients learns their
//                         number (its reduction waits for EndBackward): the first micro-batch
//                         for most, a later one for a param unused until then (on_unused =
//                         zero: a branch not taken yet, or not since a resume); later ones
//                         complete the param when that count is reached; a different count
//                         is "the graph changed".
//   on_unused = error     params without a gradient at EndBackward: UnusedParameters.
//   on_unused = zero      they contribute zeros; a param no rank used in a whole step is left
//                         untouched by it (the engine asks UsedThisStep()).
#ifndef ZERO_RUNTIME_GRAD_GUARD_H_
#define ZERO_RUNTIME_GRAD_GUARD_H_

#include <string>
#include <vector>

#include "zero/config.h"
#include "zero/status.h"

namespace zero::runtime {

class GradGuard {
 public:
  /// `names[p]` and `bucket_of[p]` for every param; frozen params have bucket_of = -1.
  GradGuard(const GuardConfig& config, std::vector<std::string> names, std::vector<int> bucket_of);

  /// Starts micro-batch number `iteration` (1-based, counted over the whole run).
  void BeginMicroBatch(int64_t iteration);

  /// May the trainer still add into `param`'s gradient? DuplicateGradient once it is complete.
  Status CheckWritable(int param, bool bucket_launched) const;
  /// Records one arrival of `param`. `*complete` tells whether the param just became complete
  /// (its bucket's pending count drops). `bucket_launched` only shapes the message.
  Status Arrive(int param, bool bucket_launched, bool* complete);
  /// Under on_unused = "zero": `param` will get no gradient this micro-batch; it becomes
  /// complete now (`*complete`) without counting as used. kFailedPrecondition once it arrived.
  Status Absent(int param, bool* complete);

  /// At EndBackward: checks counts and unused params per the policies. On success `*to_complete`
  /// lists params the engine must now treat as complete (all params after a learning
  /// micro-batch; the unused ones under on_unused = zero). `rank` is for messages. With
  /// `abandon` (a backward that did not finish), every param not complete becomes so, unchecked.
  Status AtEndBackward(int rank, std::vector<int>* to_complete, bool abandon = false);

  /// Whether `param` got a gradient on this rank in any micro-batch since the last step.
  bool UsedThisStep(int param) const { return used_in_step_[param] != 0; }
  /// Forgets the step's usage (after Step()).
  void EndStep();

  /// For messages: `"name" (index p)`.
  std::string Label(int param) const;
  /// Arrival position of `param` this micro-batch, or -1.
  int arrival(int param) const { return first_arrival_[param]; }
  /// Whether `param` is complete this micro-batch (its gradients arrived, or it was marked
  /// absent).
  bool complete(int param) const { return complete_[param] != 0; }

 private:
  // The DuplicateGradient message: the param, its bucket, both arrivals, causes and fixes.
  Status Duplicate(int param, bool bucket_launched) const;
  // The count policy's message when a param gets more gradients than it did at first.
  Status GraphChanged(int param) const;
  // Whether `param`'s arrivals this micro-batch complete it only at EndBackward, which learns
  // their count: under the count policy, until a micro-batch gave it gradients.
  bool LearnsAtEnd(int param) const;
  // AtEndBackward's checks of a finished graph: counts below those learned, unused params
  // under on_unused = "error".
  Status CheckAtEndBackward(int rank) const;

  static constexpr int kNotLearned = -1;

  const GuardConfig config_;
  const std::vector<std::string> names_;
  const std::vector<int> bucket_of_;
  int64_t iteration_ = 0;
  int arrivals_ = 0;
  std::vector<int> count_;          // arrivals this micro-batch
  std::vector<int> first_arrival_;  // position of the first arrival, or -1
  std::vector<char> complete_;
  std::vector<int> expected_;       // count policy: learned arrivals per micro-batch, or kNotLearned
  std::vector<char> used_in_step_;
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_GRAD_GUARD_H_
