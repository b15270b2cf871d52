// The data-parallel communicator: the only way the runtime talks to other ranks.
//
// Collectives are asynchronous: each call returns a Work at once; the buffers must stay valid
// and untouched until its Wait() returns. A rank's k-th collective matches every other rank's
// k-th collective, so all ranks must issue the same collectives in the same order (the engine
// launches buckets in bucket order to guarantee it). Errors, mismatches and peers that never
// arrive surface from Wait() as a Status; nothing aborts or hangs forever when a timeout is
// given.
//
// Failure semantics (those of ncclCommAbort): a collective that fails, times out, or whose Work
// is destroyed before it completed breaks the group. From then on every collective on that
// rank (and, as soon as they hear of it, on every other rank) fails at once with the first
// error, and Health() returns it. A collective whose Wait() returned, with any status, never
// touches its buffers again, except where AbandonedWorkMayTouchBuffers() says otherwise (MPI
// cannot cancel a started collective). A broken group does not heal: create new communicators.
//
// Layouts (count = elements per rank):
//   ReduceScatter  send: size()·count, recv: count; rank r gets the reduction of chunk r.
//                  In place when recv == send + rank()·count.
//   AllGather      send: count, recv: size()·count; chunk r of recv is rank r's send.
//                  In place when send == recv + rank()·count.
//   AllReduce      send, recv: count each; in place when send == recv.
//   Broadcast      data: count; the root's values everywhere.
// Sums of bf16/fp16 accumulate in fp32 (the local backend rounds once; the MPI backend's
// pairwise user operation rounds at each combining step).
#ifndef ZERO_COMMUNICATOR_H_
#define ZERO_COMMUNICATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "zero/dtype.h"
#include "zero/status.h"

namespace zero::comm {

/// Reduction of ReduceScatter and AllReduce.
enum class ReduceOp : int { kSum = 0, kMax = 1 };

/// Which collective; part of a collective's signature.
enum class CollectiveKind : int {
  kReduceScatter = 0,
  kAllGather = 1,
  kAllReduce = 2,
  kBroadcast = 3,
  kBarrier = 4,
};

/// What every rank must agree on for one collective. Two ranks whose k-th signatures differ
/// have diverged; backends that check report both signatures.
struct CollectiveSignature {
  CollectiveKind kind = CollectiveKind::kBarrier;
  int64_t count = 0;
  DType dtype = DType::kFP32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  /// What the caller says this collective is, -1 for nothing (a stage-3 gather passes its
  /// unit): ranks whose tags differ have diverged even when the sizes agree.
  int64_t tag = -1;

  bool operator==(const CollectiveSignature& other) const;
  bool operator!=(const CollectiveSignature& other) const { return !(*this == other); }
  /// e.g. "AllReduce(count=1000, fp32, sum)", "AllGather(count=512, bf16, tag=4)".
  std::string ToString() const;
};

/// The tags of collectives that carry values rather than gradients or params: the engine's own
/// (the step's norm and flags, registry hashes, a checkpoint's checksums) and a trainer's
/// through the C ABI (zero_comm_all_reduce_f32, zero_comm_broadcast_bytes). Tagged, they are
/// checked like a stage-3 gather, and the MPI communicator runs every tagged collective on a
/// communicator of its own (the external one on its channel 1): a call that only some ranks make (rank 0 alone saving a
/// checkpoint) or with another size on each rank gets an error naming both sides, or waits
/// for its timeout, and is never matched with a peer's gradient collective of another size
/// (which OpenMPI's single-copy transport turned into heap corruption).
inline constexpr int64_t kHostValuesTag = int64_t{1} << 40;
inline constexpr int64_t kTrainerValuesTag = kHostValuesTag + 1;

/// Waits forever (the default of Wait()).
inline constexpr double kNoTimeout = 0.0;
/// Longer timeouts are waited as this many seconds (about 31 years), so that converting them to
/// a clock's duration cannot overflow.
inline constexpr double kLongestWaitSeconds = 1e9;

/// A collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  /// Blocks until the collective completes and returns its outcome. With timeout_s > 0,
  /// returns kDeadlineExceeded naming the collective (and, where the backend knows them, the
  /// ranks that never arrived) once that many seconds pass; the collective is then abandoned.
  /// Any non-OK outcome breaks the group (see the failure semantics above). Destroying a Work
  /// whose collective has not completed abandons it the same way; it never blocks.
  virtual Status Wait(double timeout_s = kNoTimeout) = 0;
  /// True once the collective has completed (successfully or not); never blocks.
  virtual bool Test() = 0;
  /// Makes the work queued on `stream` (a cudaStream_t) after this call run after the
  /// collective, without blocking the host. The Work must still be kept until Test() is true
  /// (or waited for): destroying it earlier abandons the collective. With timeout_s > 0 the
  /// backend watches it: one not complete within timeout_s breaks the group (and ends its
  /// kernels, so nothing waits for it forever), as do asynchronous errors. kUnimplemented
  /// where the backend cannot order a stream (local, mpi): the caller waits instead.
  virtual Status WaitOnStream(void* stream, double timeout_s) {
    (void)stream;
    (void)timeout_s;
    return absl::UnimplementedError("this communicator cannot order a stream after a collective");
  }
};

using WorkPtr = std::unique_ptr<Work>;

/// One rank's endpoint of a data-parallel group. Not thread-safe: one rank issues its
/// collectives from one thread at a time (different ranks may be different threads).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Backend name: "local", "mpi", "nccl", "external".
  virtual const char* backend() const = 0;
  /// True when collectives take CUDA device buffers only (nccl); host values must be staged.
  virtual bool device_buffers_only() const { return false; }
  /// True when a collective on device buffers starts after the work queued on the trainer's
  /// stream before the call (nccl orders its stream after it), and the stream can wait for it
  /// in turn (Work::WaitOnStream); otherwise the caller finishes that work first and waits on
  /// the host.
  virtual bool ordered_after_stream() const { return false; }
  /// The cudaStream_t an ordered_after_stream() communicator orders its collectives after
  /// (NcclOptions::stream; null: the legacy default stream). The engine relies on the order
  /// only when this is its own stream, and waits on the host otherwise.
  virtual void* stream() const { return nullptr; }
  /// How many ranks of this group run on this machine, this one included. They share its
  /// cores, so the engine sizes its CPU kernels' thread teams by it (cpu_exec.h). local: size();
  /// mpi: counted at creation (MPI_COMM_TYPE_SHARED); nccl: its bootstrap's; external: what
  /// its creator says (torchrun's LOCAL_WORLD_SIZE). The default, for
  /// other backends and wrappers, is 1 (a rank alone on its machine).
  virtual int ranks_on_this_host() const { return 1; }

  /// OK while the group works; once it is broken (a collective failed, timed out or was
  /// abandoned, on this rank or on a peer this rank has heard from), the first error, naming
  /// the collective and the rank where it failed. Never blocks.
  virtual Status Health() const = 0;
  /// True when a collective abandoned after the group broke may still read or write its
  /// buffers: MPI has no way to cancel a started collective. The owner of such buffers must
  /// then keep them allocated (the engine then stops freeing its memory, on purpose). False for
  /// local (an abandoned collective never runs) and nccl (the communicator is aborted);
  /// external: true once a collective on the caller's buffers was given up unfinished (the
  /// table may run it on); the default, for other backends and wrappers, assumes the worst
  /// once the group is broken.
  virtual bool AbandonedWorkMayTouchBuffers() const { return !Health().ok(); }

  virtual WorkPtr ReduceScatter(const void* send, void* recv, int64_t count, DType dtype,
                                ReduceOp op) = 0;
  /// `tag` ≥ 0 (CollectiveSignature::tag) names what is gathered; the in-process, MPI and
  /// external communicators check that every rank passed the same one (MPI and external: one
  /// small all-gather first), so ranks that gather different things of one size get
  /// kInvalidArgument naming both tags and ranks. NCCL does not check. MPI decides per rank: a rank whose collective is
  /// untagged where a peer's is tagged runs it on another MPI communicator than that peer's,
  /// so both wait for their timeout (guard.timeout_s) rather than naming each other.
  virtual WorkPtr AllGather(const void* send, void* recv, int64_t count, DType dtype, int64_t tag = -1) = 0;
  /// `tag` as AllGather's: kHostValuesTag and kTrainerValuesTag mark values, not gradients.
  virtual WorkPtr AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                            ReduceOp op, int64_t tag = -1) = 0;
  /// From rank `root` to every rank, in place; `tag` as AllGather's.
  virtual WorkPtr Broadcast(void* data, int64_t count, DType dtype, int root, int64_t tag = -1) = 0;
  virtual WorkPtr Barrier() = 0;

  /// Ends every process of the job with `exit_code` (MPI_Abort), so a batch job with one
  /// failed rank ends instead of hanging. For command-line tools after a fatal error; the
  /// library itself never calls it. Backends without a job to end (local, nccl) return
  /// kUnimplemented and the caller exits normally.
  virtual Status AbortJob(int exit_code) {
    (void)exit_code;
    return absl::UnimplementedError(absl::StrCat("the ", backend(), " communicator has no job to abort"));
  }
};

/// A Work that is already complete with `status` (e.g. a launch that failed validation).
WorkPtr CompletedWork(Status status);

/// The most ranks one in-process group takes (CreateLocalGroup): each is a thread of the process.
inline constexpr int kMaxLocalGroupSize = 4096;

/// Creates the `size` (1 to kMaxLocalGroupSize) communicators of one in-process group (backend "local": N ranks
/// as threads of one process); element r is rank r. Each is used by one thread; the group
/// lives as long as any of its communicators. Deterministic: reductions are taken in rank
/// order 0..N-1 and rounded once, so a reduce-scatter and an all-reduce of the same data give
/// identical bits. Buffers may be host memory or CUDA device memory (all ranks' of one kind,
/// on one GPU or peer-accessible GPUs: device copies plus a reduction kernel).
StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateLocalGroup(int size);

/// Options of the MPI communicator.
struct MpiOptions {
  /// Agree on each collective's signature before running it (one extra small all-gather), so
  /// ranks that diverge get kInvalidArgument naming both sides instead of a hang.
  bool check_signatures = false;
};

/// Creates a communicator (backend "mpi") over a duplicate of `*mpi_comm` (an MPI_Comm*; null
/// means MPI_COMM_WORLD). Initialises MPI when the program has not (and finalises it at exit).
/// CUDA device buffers are staged through pinned host memory, unless the MPI reports CUDA
/// awareness and the reduction is a built-in one (fp32). kUnimplemented in builds without MPI.
StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(const void* mpi_comm,
                                                              MpiOptions options = {});

/// Ends every process of the MPI job with `exit_code` (MPI_Abort on MPI_COMM_WORLD), whether or
/// not a communicator is alive: for a trainer whose rank fails outside any collective (an
/// exception before or between steps), so that its peers, waiting in a collective or in
/// MPI_Finalize for it, end at once instead of after their timeout or never. The library
/// itself never calls it. kFailedPrecondition when MPI is not initialised or already
/// finalised (there is no job to end), kUnimplemented in builds without MPI.
Status AbortMpiJob(int exit_code);

/// Options of the NCCL communicator.
struct NcclOptions {
  /// The cudaStream_t the trainer computes on (null: the legacy default stream). Each
  /// collective starts after the work queued there before the call.
  void* stream = nullptr;
  /// CUDA device of this rank; -1 keeps the current device.
  int device = -1;
};

/// Creates this rank's NCCL communicator (backend "nccl", device buffers, one rank per GPU)
/// over the same ranks as `bootstrap`, which carries the ncclUniqueId from rank 0.
/// kUnimplemented in builds without NCCL, kUnavailable without a GPU.
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap,
                                                               NcclOptions options = {});

/// One collective an ExternalCollectives table is asked to run, in the layouts at the top of
/// this file: ReduceScatter send size()·count → recv count; AllGather send count → recv
/// size()·count; AllReduce count → count; Broadcast in place on `recv` (== send); Barrier no
/// buffers. Buffers are host memory. Sums of bf16/fp16 must accumulate in fp32.
struct ExternalCollective {
  CollectiveKind kind = CollectiveKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;
  DType dtype = DType::kFP32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  /// 0: gradients and params; 1: tagged collectives (values, stage-3 gathers, signature
  /// checks). Each channel is its own ordered stream of collectives, the same on every rank;
  /// the table runs the two on separate groups, so one channel never waits behind the other.
  int channel = 0;
};

/// The functions an external communicator runs its collectives with (a trainer's own
/// communication layer: zerort.torch's torch.distributed). Called from the thread that issues
/// or waits for a collective, one call at a time per communicator.
struct ExternalCollectives {
  /// Starts a collective and returns its handle (any value the table chooses), or why not.
  std::function<StatusOr<int64_t>(const ExternalCollective&)> start;
  /// Waits for a started collective: OK, kDeadlineExceeded once timeout_s (> 0; 0: no limit)
  /// passed, or its error.
  std::function<Status(int64_t handle, double timeout_s)> wait;
  /// True once the collective completed (successfully or not); never blocks.
  std::function<bool(int64_t handle)> test;
  /// The handle is no longer needed: its wait returned, or it was abandoned (the group is then
  /// broken; the table may let the collective run on).
  std::function<void(int64_t handle)> release;
  /// Called once, when the communicator and all its works are gone; may be empty.
  std::function<void()> destroy;
};

/// Options of the external communicator.
struct ExternalOptions {
  /// Ranks of the group on this machine, this one included (ranks_on_this_host()).
  int ranks_on_this_host = 1;
  /// Longest wait for the signature check before a tagged collective (0: no limit).
  double check_timeout_s = 1800.0;
};

/// Creates this rank's communicator (backend "external") of a group of `size` whose
/// collectives `collectives` runs. Each tagged collective (CollectiveSignature::tag ≥ 0) first
/// all-gathers every rank's signature on channel 1 and fails with kInvalidArgument naming
/// both sides when they differ. A failed or timed-out collective breaks the group (see the
/// failure semantics above); peers hear of it only through their own collectives failing.
/// On error nothing of the table has been called.
StatusOr<std::unique_ptr<Communicator>> CreateExternalCommunicator(int rank, int size,
                                                                   ExternalCollectives collectives,
                                                                   ExternalOptions options = {});

/// Whether this build has the MPI / NCCL backends.
bool MpiAvailable();
bool NcclAvailable();

/// Checks the arguments every backend shares: count ≥ 0, non-null buffers when count > 0,
/// 0 ≤ root < size. kInvalidArgument names the collective and the problem.
Status ValidateCollective(const CollectiveSignature& signature, const void* a, const void* b,
                          int size);

}  // namespace zero::comm

#endif  // ZERO_COMMUNICATOR_H_
