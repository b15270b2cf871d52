// The MPI communicator: a progress thread launching and testing non-blocking collectives.
// Untagged collectives (gradients, params at stages 0-2) run on one duplicate of the parent
// communicator, tagged ones (stage-3 gathers, values: CollectiveSignature::tag) on another,
// after a signature check, so that a rank's tagged collective is never matched with a peer's
// untagged one of another size.
//
// Failure semantics (zero/communicator.h): when a collective fails, times out or is abandoned,
// this rank's group breaks. The progress thread then fails every collective in flight with the
// first error and sends a notice to every peer over a private duplicate communicator; each
// rank keeps a receive posted there, checked by its progress thread (every 20 ms when idle), so
// peers break too as soon as the notice arrives instead of waiting for their own timeout. MPI
// cannot cancel a started collective: its requests and staging buffers are kept (leaked) rather
// than freed, and AbandonedWorkMayTouchBuffers() tells the buffers' owners to keep theirs.
//
// A rank that leaves while its peers go on (its process ends: SystemExit, an exception caught
// outside the training loop, a script that runs fewer steps) destroys its communicator, or MPI
// finalises it, with no error of its own. Its peers do not answer the agreement at destroy
// then, so it sends them a departure notice on the same private communicator, with how many
// collectives it joined. A departure breaks nothing by itself (a peer may go on with work that
// needs no collective, such as rank 0 writing the model), nor a collective the leaver joined;
// a collective it never joined breaks the group at once, naming the rank that left, instead of
// waiting guard.timeout_s for it. The notices and the agreement are PeerNotices
// (peer_notices.h).
#include "zero/communicator.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if ZERO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "absl/strings/str_cat.h"
#include "base/status_converters.h"
#include "comm/completion.h"
#include "comm/group_health.h"
#include "comm/mpi/device_staging.h"
#include "comm/mpi/mpi_operation.h"
#include "comm/mpi/mpi_ops.h"
#include "comm/mpi/mpi_rounds.h"
#include "comm/mpi/mpi_setup.h"
#include "comm/signature_words.h"
#include "comm/mpi/mpi_tuning.h"
#include "comm/mpi/peer_notices.h"
#include "comm/mpi/scratch_pool.h"
#include "zero/device.h"

namespace zero::comm {
namespace {

constexpr double kDrainSecondsAtDestroy = 2.0;  // collectives in flight when a communicator goes
constexpr int kEagerPolls = 20000;  // ≈ a few ms of MPI_Test without progress
constexpr auto kBrokenCheckInterval = std::chrono::milliseconds(20);
constexpr int kPointToPointTags = 30000;  // tags of collectives built from point-to-point calls

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, MPI_Comm tagged, MPI_Comm control, int rank, int size,
                  int ranks_on_this_host, UserOps ops, MpiOptions options,
                  ReduceScatterChoice reduce_scatter, AllReduceChoice all_reduce)
      : comm_(comm), tagged_(tagged), notices_(control, rank, size), rank_(rank), size_(size),
        ranks_on_this_host_(ranks_on_this_host), ops_(ops), options_(options),
        reduce_scatter_(std::move(reduce_scatter)), all_reduce_(std::move(all_reduce)),
        cuda_aware_(MpiIsCudaAware()),
        progress_([this] { ProgressLoop(); }) {}

  ~MpiCommunicator() override {
    const bool finalizing = UnregisterProgressThread(this);
    StopProgress();
    int finalized = 0;
    if (!finalizing) MPI_Finalized(&finalized);
    if (!finalizing && !finalized) {
      // A peer's notice that arrived (it left, or its group broke) makes this rank vote as
      // not healthy.
      const bool noticed = notices_.CancelReceive();
      const DestroyAgreement agreement = notices_.Agree(health_->Get().ok() && !notices_.departed() && !noticed);
      if (agreement == DestroyAgreement::kNoAnswer) notices_.SendDeparture(next_sequence_);
      notices_.ReleaseSends();
      if (agreement == DestroyAgreement::kEveryRankHealthy) {
        ops_.Free();
        MPI_Comm_free(&comm_);
        MPI_Comm_free(&tagged_);
      }  // else kept: a peer's abandoned collectives may still arrive on them, and a freed
         // communicator's late messages hung the job's next MPI_Comm_dup
    }
    // Deliberate leaks: MPI may still use these after we are gone (see the file comment).
    for (auto& o : abandoned_) static_cast<void>(o.release());
  }

  /// From MPI_Finalize's hook, when the communicator outlives MPI (as one that a garbage
  /// collector had not reached by the program's exit): the group breaks, so every collective
  /// in flight or asked for later fails at once with the reason, and the progress thread stops
  /// without another MPI call. MPI still works here: when the peers do not answer the
  /// agreement (they are not finalising too), they are told that this rank leaves.
  void StopBeforeFinalize() {
    bool healthy = false;
    {  // under the lock: the progress thread sees both or neither, so it sends no broken-group
       // notice for this break, and fails what is in flight with it
      std::lock_guard<std::mutex> lock(mutex_);
      healthy = health_->Get().ok();
      health_->Break(absl::FailedPreconditionError(absl::StrCat(
          "MPI was finalised while the MPI communicator of rank ", rank_, " was alive; it runs no "
          "more collectives (close engines and communicators before MPI_Finalize)")));
      finalizing_ = true;
    }
    StopProgress();
    // With collectives in flight (now abandoned) the peers wait for this rank: it votes as not
    // healthy (without waiting), so that no peer frees communicators those collectives use,
    // and tells them it left before the first of them.
    const bool in_flight = first_abandoned_ != INT64_MAX;
    const bool leaves_healthy = healthy && !notices_.departed();
    const DestroyAgreement agreement = notices_.Agree(leaves_healthy && !in_flight);
    if (leaves_healthy && (in_flight || agreement == DestroyAgreement::kNoAnswer)) {
      notices_.SendDeparture(std::min(next_sequence_, first_abandoned_));
    }
    notices_.CancelReceive();
    notices_.ReleaseSends();  // MPI_Finalize completes them
  }

  /// Stops the progress thread, draining what is in flight (once: from the destructor, or
  /// from StopBeforeFinalize).
  void StopProgress() {
    std::lock_guard<std::mutex> once(stop_mutex_);
    if (!progress_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    progress_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  int ranks_on_this_host() const override { return ranks_on_this_host_; }
  Status Health() const override { return health_->Get(); }

  WorkPtr ReduceScatter(const void* send, void* recv, int64_t count, DType dtype,
                        ReduceOp op) override {
    const CollectiveSignature s{CollectiveKind::kReduceScatter, count, dtype, op, 0};
    auto operation = Prepare(s, send, recv);
    if (!operation.ok()) return CompletedWork(operation.status());
    Operation& o = **operation;
    const size_t bytes = static_cast<size_t>(count) * DTypeSize(dtype);
    const Status staged = StageIfOnDevice(o, &send, &recv, bytes * size_, bytes, /*only_mpi_touches_buffers=*/false);
    if (!staged.ok()) return Skipped(staged);
    const ReduceScatterCall call = Call(o, send, recv);
    const ReduceScatterAlgorithm algorithm = reduce_scatter_.For(static_cast<int64_t>(bytes) * size_);
    o.scratch = scratch_.Take(ReduceScatterScratchBytes(algorithm, call));
    o.rounds = ReduceScatterRounds(algorithm, call, o.scratch.data.get());
    return Submit(std::move(*operation));
  }

  WorkPtr AllGather(const void* send, void* recv, int64_t count, DType dtype, int64_t tag = -1) override {
    const CollectiveSignature s{CollectiveKind::kAllGather, count, dtype, ReduceOp::kSum, 0, tag};
    auto operation = Prepare(s, send, recv);
    if (!operation.ok()) return CompletedWork(operation.status());
    const size_t bytes = static_cast<size_t>(count) * DTypeSize(dtype);
    const Status staged = StageIfOnDevice(**operation, &send, &recv, bytes, bytes * size_, true);
    if (!staged.ok()) return Skipped(staged);
    const bool in_place = static_cast<const char*>(recv) + rank_ * bytes == send;
    const void* source = in_place ? MPI_IN_PLACE : send;
    const MPI_Datatype type = Type(dtype);
    const MPI_Comm comm = (*operation)->comm;
    (*operation)->rounds.push_back(OneCall([source, recv, count, type, comm](MPI_Request* request) {
      return MPI_Iallgather(source, static_cast<int>(count), type, recv, static_cast<int>(count),
                            type, comm, request);
    }));
    return Submit(std::move(*operation));
  }

  WorkPtr AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                    ReduceOp op, int64_t tag = -1) override {
    const CollectiveSignature s{CollectiveKind::kAllReduce, count, dtype, op, 0, tag};
    auto operation = Prepare(s, send, recv);
    if (!operation.ok()) return CompletedWork(operation.status());
    const size_t bytes = static_cast<size_t>(count) * DTypeSize(dtype);
    Operation& o = **operation;
    const AllReduceAlgorithm algorithm = all_reduce_.For(static_cast<int64_t>(bytes));
    const Status staged = StageIfOnDevice(o, &send, &recv, bytes, bytes, algorithm == AllReduceAlgorithm::kNative);
    if (!staged.ok()) return Skipped(staged);
    const AllReduceCall call = Call(o, send, recv);
    const int64_t piece_bytes = kProbeBytes[kProbeRanges - 1];
    o.scratch = scratch_.Take(AllReduceScratchBytes(algorithm, call, piece_bytes));
    o.rounds = AllReduceRounds(algorithm, call, piece_bytes, o.scratch.data.get());
    return Submit(std::move(*operation));
  }

  WorkPtr Broadcast(void* data, int64_t count, DType dtype, int root, int64_t tag = -1) override {
    const CollectiveSignature s{CollectiveKind::kBroadcast, count, dtype, ReduceOp::kSum, root, tag};
    auto operation = Prepare(s, data, data);
    if (!operation.ok()) return CompletedWork(operation.status());
    const size_t bytes = static_cast<size_t>(count) * DTypeSize(dtype);
    const void* source = data;
    void* target = data;
    const Status staged = StageIfOnDevice(**operation, &source, &target, bytes, bytes, true);
    if (!staged.ok()) return Skipped(staged);
    if (target != data) std::memcpy(target, source, bytes);  // staged: broadcast the host copy
    const MPI_Datatype type = Type(dtype);
    const MPI_Comm comm = (*operation)->comm;
    (*operation)->rounds.push_back(OneCall([target, count, type, root, comm](MPI_Request* request) {
      return MPI_Ibcast(target, static_cast<int>(count), type, root, comm, request);
    }));
    return Submit(std::move(*operation));
  }

  Status AbortJob(int exit_code) override {
    ZERO_MPI_RETURN_IF_ERROR(MPI_Abort(comm_, exit_code));
    return absl::OkStatus();
  }

  WorkPtr Barrier() override {
    const CollectiveSignature s{CollectiveKind::kBarrier, 0, DType::kFP32, ReduceOp::kSum, 0};
    auto operation = Prepare(s, nullptr, nullptr);
    if (!operation.ok()) return CompletedWork(operation.status());
    (*operation)->rounds.push_back(OneCall([this](MPI_Request* request) { return MPI_Ibarrier(comm_, request); }));
    return Submit(std::move(*operation));
  }

 private:
  // bf16 and fp16 travel as 16-bit words reduced by our user operations (mpi_ops.h); the
  // other types are MPI's own, reduced by its built-in operations except the uint8 sum.
  static MPI_Datatype Type(DType dtype) {
    switch (dtype) {
      case DType::kFP32: return MPI_FLOAT;
      case DType::kBF16:
      case DType::kFP16: return MPI_UINT16_T;
      case DType::kInt64: return MPI_INT64_T;
      case DType::kUInt8: return MPI_UINT8_T;
    }
    return MPI_DATATYPE_NULL;
  }
  MPI_Op Op(DType dtype, ReduceOp op) const { return ops_.Get(dtype, op); }

  // The arguments of `o`, a reduce-scatter or all-reduce built from rounds, for the collective
  // Submit will number next (its point-to-point tag).
  ReduceScatterCall Call(const Operation& o, const void* send, void* recv) const {
    const CollectiveSignature& s = o.signature;
    ReduceScatterCall call;
    call.send = send;
    call.recv = recv;
    call.count = s.count;
    call.dtype = s.dtype;
    call.op = s.op;
    call.mpi_type = Type(s.dtype);
    call.mpi_op = Op(s.dtype, s.op);
    call.comm = o.comm;
    call.rank = rank_;
    call.size = size_;
    call.tag = static_cast<int>(next_sequence_ % kPointToPointTags);
    return call;
  }

  // A collective this rank cannot issue after all (its device buffers could not be staged):
  // its peers issue it, so the group is broken, as for an invalid call (Prepare).
  WorkPtr Skipped(const Status& failure) {
    health_->Break(failure);
    return CompletedWork(failure);
  }

  StatusOr<std::unique_ptr<Operation>> Prepare(const CollectiveSignature& s, const void* a,
                                               const void* b) {
    if (!health_->Get().ok()) return health_->BrokenError(s.ToString().c_str());
    Status valid = ValidateCollective(s, a, b, size_);
    if (valid.ok() && s.count > INT_MAX) {
      valid = absl::InvalidArgumentError(absl::StrCat(
          s.ToString(), ": MPI counts are limited to ", INT_MAX, " elements per call"));
    }
    if (!valid.ok()) {  // this rank skips a collective its peers issue: the group is broken
      health_->Break(valid);
      return valid;
    }
    auto operation = std::make_unique<Operation>();
    operation->signature = s;
    operation->comm = s.tag >= 0 ? tagged_ : comm_;
    return operation;
  }

  // When `send`/`recv` are CUDA device memory (and MPI cannot take them directly), copies the
  // input into pinned host memory now, points the collective at host buffers, and arranges the
  // copy back after completion. `send_bytes`/`recv_bytes` are the buffers' full sizes.
  // `only_mpi_touches_buffers`: the collective's rounds are MPI calls alone (no host copy or
  // add of ours), so a CUDA-aware MPI may be given device memory when it reduces with its own
  // operations (fp32, int64).
  Status StageIfOnDevice(Operation& o, const void** send, void** recv, size_t send_bytes,
                         size_t recv_bytes, bool only_mpi_touches_buffers) {
    const bool device = PlacementOf(*send) == Placement::kDevice || PlacementOf(*recv) == Placement::kDevice;
    if (!device) return absl::OkStatus();
    const bool reduces = o.signature.kind == CollectiveKind::kReduceScatter ||
                         o.signature.kind == CollectiveKind::kAllReduce;
    const bool builtin_op = !reduces || o.signature.dtype == DType::kFP32 || o.signature.dtype == DType::kInt64;
    if (cuda_aware_ && only_mpi_touches_buffers && builtin_op) return absl::OkStatus();
#if ZERO_HAVE_CUDA
    ZERO_CUDA_RETURN_IF_ERROR(cudaGetDevice(&o.device));
    ZERO_RETURN_IF_ERROR(o.staged_send.Allocate(send_bytes));
    ZERO_RETURN_IF_ERROR(o.staged_recv.Allocate(recv_bytes));
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpy(o.staged_send.data(), *send, send_bytes, cudaMemcpyDefault));
    void* device_recv = *recv;
    *send = o.staged_send.data();
    *recv = o.staged_recv.data();
    o.finish = [&o, device_recv, recv_bytes]() -> Status {
      ZERO_CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device));  // the progress thread copies back
      ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpy(device_recv, o.staged_recv.data(), recv_bytes, cudaMemcpyDefault));
      return absl::OkStatus();
    };
    return absl::OkStatus();
#else
    (void)send_bytes;
    (void)recv_bytes;
    return absl::UnimplementedError("CUDA device buffers need a build with CUDA");
#endif
  }

  WorkPtr Submit(std::unique_ptr<Operation> operation) {
    operation->sequence = next_sequence_++;
    auto work = std::make_unique<MpiWork>(
        operation->completion, health_,
        absl::StrCat("MPI ", operation->signature.ToString(), " (collective #",
                     operation->sequence, ") on rank ", rank_, " of ", size_));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      submitted_.push_back(std::move(operation));
    }
    wake_.notify_all();
    return work;
  }

  // Starts the next phase of `o`: the signature all-gather (every collective with
  // check_signatures, a tagged one always), or the collective's first round. Every signature
  // check runs on tagged_, so with check_signatures a rank whose collective is untagged where a
  // peer's is tagged is named too.
  void Launch(Operation& o) {
    const bool check = options_.check_signatures || o.signature.tag >= 0;
    if (check && o.phase == Operation::Phase::kQueued) {
      EncodeSignature(o.signature, o.mine);
      o.everyone.resize(static_cast<size_t>(size_) * kSignatureWords);
      o.phase = Operation::Phase::kChecking;
      o.requests.assign(1, MPI_REQUEST_NULL);
      const int rc = MPI_Iallgather(o.mine, kSignatureWords, MPI_INT64_T, o.everyone.data(),
                                    kSignatureWords, MPI_INT64_T, tagged_, &o.requests[0]);
      if (rc != MPI_SUCCESS) Fail(o, MpiStatus(rc, "launching", o));
      return;
    }
    o.phase = Operation::Phase::kRunning;
    RunRounds(o);
  }

  // Runs `o`'s rounds from the next one until a round leaves requests in flight, or completes
  // `o` after the last. A round's local work never runs once the caller abandoned the Work
  // (it may have freed the buffers the round reads and writes).
  void RunRounds(Operation& o) {
    while (o.next_round < o.rounds.size()) {
      o.requests.clear();
      int rc = MPI_SUCCESS;
      const bool ran = o.completion->RunUnlessAbandoned(
          [&] { rc = o.rounds[o.next_round++](&o.requests); });
      if (!ran) {
        Fail(o, absl::CancelledError(absl::StrCat(o.signature.ToString(), " (collective #",
                                                  o.sequence, ") was abandoned")));
        return;
      }
      if (rc != MPI_SUCCESS) {
        Fail(o, MpiStatus(rc, "running", o));
        return;
      }
      if (!o.requests.empty()) return;
    }
    // Every round has run and MPI holds no request on the temporaries: they go back to the
    // pool before the caller is woken, so its next collective reuses them (a fresh 16 MiB
    // buffer costs ~25 ms of page faults here, which the caller would otherwise pay whenever it
    // submits before this thread had returned the previous one).
    scratch_.Give(std::exchange(o.scratch, ScratchBuffer{}));
    // No copy-out once abandoned; a copy-out that fails leaves this rank without the result
    // its peers have, so it breaks the group like any other failure.
    o.completion->CompleteAfter(
        [this, &o]() -> Status {
          Status copied = o.finish ? o.finish() : absl::OkStatus();
          if (!copied.ok()) health_->Break(copied);
          return copied;
        },
        absl::OkStatus());
  }

  // Completes `o` with a failure, which breaks the group.
  void Fail(Operation& o, Status failure) {
    health_->Break(failure);
    o.completion->Complete(std::move(failure));
  }

  Status MpiStatus(int rc, const char* doing, const Operation& o) const {
    char text[MPI_MAX_ERROR_STRING] = {0};
    int length = 0;
    MPI_Error_string(rc, text, &length);
    int error_class = rc;
    MPI_Error_class(rc, &error_class);
    const char* hint = error_class == MPI_ERR_TRUNCATE
                           ? " (a peer sent more than this rank's collective receives: the ranks called "
                             "collectives of different sizes, so they have diverged)"
                           : "";
    return absl::InternalError(absl::StrCat("MPI error while ", doing, " ", o.signature.ToString(),
                                            " (collective #", o.sequence, ") on rank ", rank_,
                                            ": ", text, hint));
  }

  // After the signature all-gather: the first rank whose signature differs, if any.
  Status CompareSignatures(const Operation& o) const {
    for (int r = 0; r < size_; ++r) {
      const CollectiveSignature theirs = DecodeSignature(&o.everyone[r * kSignatureWords]);
      if (theirs != o.signature) {
        return absl::InvalidArgumentError(absl::StrCat(
            "collective #", o.sequence, " mismatch: rank ", rank_, " called ",
            o.signature.ToString(), " but rank ", r, " called ", theirs.ToString(),
            "; all ranks must issue the same collectives in the same order"));
      }
    }
    return absl::OkStatus();
  }

  // Tests `o`'s requests; once they have all completed, advances it. Returns true when
  // something happened.
  bool Advance(Operation& o) {
    int flag = 0;
    statuses_.resize(o.requests.size());
    int rc = MPI_Testall(static_cast<int>(o.requests.size()), o.requests.data(), &flag, statuses_.data());
    if (rc == MPI_ERR_IN_STATUS) {  // the failed request's own error says what went wrong
      for (const MPI_Status& status : statuses_) {
        if (status.MPI_ERROR != MPI_SUCCESS && status.MPI_ERROR != MPI_ERR_PENDING) {
          rc = status.MPI_ERROR;
          break;
        }
      }
    }
    if (rc != MPI_SUCCESS) {
      Fail(o, MpiStatus(rc, "running", o));
      return true;
    }
    if (!flag) return false;
    if (o.phase == Operation::Phase::kChecking) {
      Status agreed = CompareSignatures(o);
      if (!agreed.ok()) {
        Fail(o, std::move(agreed));
      } else {
        Launch(o);
      }
      return true;
    }
    RunRounds(o);
    return true;
  }

  // The group is broken: fails every collective in `active` that has not completed and keeps
  // them all in abandoned_ (MPI may still use their buffers: kept until exit).
  void AbandonActive(std::deque<std::unique_ptr<Operation>>& active) {
    for (auto& o : active) {
      if (!o->completion->done()) {
        o->completion->Complete(health_->BrokenError(o->signature.ToString().c_str()));
        first_abandoned_ = std::min(first_abandoned_, o->sequence);
      }
      abandoned_.push_back(std::move(o));
    }
    active.clear();
  }

  // Takes a peer's notice: a departure breaks the group when a collective in flight is one
  // the leaver never issued (those it issued go on: they may complete). Once the group is
  // broken (here, by a notice or elsewhere), fails every collective in flight and, once,
  // tells every peer why. Called by the progress thread only.
  void ExchangeNotices(std::deque<std::unique_ptr<Operation>>& active) {
    notices_.Receive(*health_);
    for (const auto& o : active) {
      if (!notices_.departed() || !health_->Get().ok()) break;
      if (!o->completion->done()) health_->Break(notices_.DepartureError(o->sequence, rank_));
    }
    const Status broken = health_->Get();
    if (broken.ok()) return;
    AbandonActive(active);
    if (notices_.broken_sent()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (finalizing_) return;  // MPI is going (StopBeforeFinalize tells the peers itself)
    }
    notices_.SendBroken(broken);
  }

  void ProgressLoop() {
    std::deque<std::unique_ptr<Operation>> active;
    std::chrono::steady_clock::time_point drain_deadline{};
    int idle_polls = 0;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        // Idle, the thread wakes every kBrokenCheckInterval: to look for a peer's notice, and to
        // send this rank's notices when the group broke in a caller's thread (a failed Wait, an
        // invalid call, an abandoned Work), which checks no condition variable.
        if (active.empty()) {
          wake_.wait_for(lock, kBrokenCheckInterval, [this] {
            return stopping_ || !submitted_.empty() || (!notices_.broken_sent() && !health_->Get().ok());
          });
        }
        while (!submitted_.empty()) {
          active.push_back(std::move(submitted_.front()));
          submitted_.pop_front();
        }
        if (finalizing_) {  // MPI is going: fail what is in flight, make no MPI call
          AbandonActive(active);
          return;
        }
        if (stopping_) {
          if (active.empty()) return;
          const auto now = std::chrono::steady_clock::now();
          if (!health_->Get().ok()) {
            // Broken: nothing will complete these; ExchangeNotices below fails them.
          } else if (drain_deadline == std::chrono::steady_clock::time_point{}) {
            drain_deadline = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double>(kDrainSecondsAtDestroy));
          } else if (now > drain_deadline) {
            health_->Break(absl::CancelledError(absl::StrCat(
                "the MPI communicator of rank ", rank_, " was destroyed with ", active.size(),
                " collective(s) still in flight")));
          }
        }
      }
      ExchangeNotices(active);
      // Launch in submission order. With signature checks, a collective's check may start only
      // after every earlier collective is running, so all ranks launch in the same order.
      for (auto& o : active) {
        if (o->completion->done()) continue;
        if (o->phase == Operation::Phase::kChecking) break;
        if (o->phase == Operation::Phase::kQueued) {
          Launch(*o);
          if (o->phase == Operation::Phase::kChecking) break;
        }
      }
      bool progressed = false;
      for (auto& o : active) {
        if (!o->completion->done() && o->phase != Operation::Phase::kQueued) {
          progressed |= Advance(*o);
        }
      }
      // Only collectives that succeeded leave: after a failure MPI may still write into a
      // failed one's buffers, and ExchangeNotices moves it to abandoned_ instead.
      while (!active.empty() && active.front()->completion->done() && health_->Get().ok()) {
        active.pop_front();
      }
      // OpenMPI advances non-blocking collectives only inside MPI calls, so poll eagerly (a
      // 50 µs nap between polls cost up to 10× bandwidth); back off only after a long stall
      // (a peer that is late), so waiting ranks do not starve computing ones.
      idle_polls = progressed ? 0 : idle_polls + 1;
      if (idle_polls > kEagerPolls) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else {
        std::this_thread::yield();
      }
    }
  }

  MPI_Comm comm_;      // untagged collectives: gradients, and params at stages 0-2
  MPI_Comm tagged_;    // tagged ones (stage-3 gathers, values) and every signature check
  PeerNotices notices_;  // progress thread, then (once it stopped) destructor or hook only
  const int rank_, size_, ranks_on_this_host_;
  UserOps ops_;
  const MpiOptions options_;
  const ReduceScatterChoice reduce_scatter_;
  const AllReduceChoice all_reduce_;
  const bool cuda_aware_;
  int64_t next_sequence_ = 0;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Operation>> submitted_;
  bool stopping_ = false;
  bool finalizing_ = false;  // MPI_Finalize has begun (StopBeforeFinalize)
  std::shared_ptr<GroupHealth> health_ = std::make_shared<GroupHealth>();
  ScratchPool scratch_;
  std::vector<MPI_Status> statuses_;                  // Advance's, reused (progress thread only)
  std::vector<std::unique_ptr<Operation>> abandoned_;  // never freed: MPI may still use them
  int64_t first_abandoned_ = INT64_MAX;                // the first collective failed unfinished
  std::mutex stop_mutex_;  // StopProgress, from the destructor or MPI_Finalize's hook
  std::thread progress_;  // last: starts after everything above is initialised
};

}  // namespace

bool MpiAvailable() { return true; }

StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(const void* mpi_comm,
                                                              MpiOptions options) {
  ZERO_RETURN_IF_ERROR(EnsureMpiInitialized());
  if (mpi_comm == nullptr) ZERO_RETURN_IF_ERROR(RequireMpiLaunch());
  const MPI_Comm parent = mpi_comm != nullptr ? *static_cast<const MPI_Comm*>(mpi_comm)
                                              : MPI_COMM_WORLD;
  MPI_Comm comm, tagged, control;
  ZERO_MPI_RETURN_IF_ERROR(MPI_Comm_dup(parent, &comm));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Comm_dup(comm, &tagged));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Comm_dup(comm, &control));
  int rank = 0, size = 0;
  ZERO_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &rank));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &size));
  UserOps ops;
  Status created = ops.Create();
  ReduceScatterChoice reduce_scatter;
  AllReduceChoice all_reduce;
  StatusOr<int> ranks_on_this_host = 1;
  if (created.ok()) ranks_on_this_host = CountRanksOnThisHost(comm);
  if (created.ok()) created = ranks_on_this_host.status();
  if (created.ok()) created = ChooseAlgorithms(comm, rank, size, &reduce_scatter, &all_reduce);
  if (!created.ok()) {
    ops.Free();
    MPI_Comm_free(&comm);
    MPI_Comm_free(&tagged);
    MPI_Comm_free(&control);
    return created;
  }
  auto communicator = std::make_unique<MpiCommunicator>(comm, tagged, control, rank, size, *ranks_on_this_host, ops,
                                                        options, std::move(reduce_scatter), std::move(all_reduce));
  MpiCommunicator* stoppable = communicator.get();
  ZERO_RETURN_IF_ERROR(RegisterProgressThread(stoppable, [stoppable] { stoppable->StopBeforeFinalize(); }));
  return std::unique_ptr<Communicator>(std::move(communicator));
}

}  // namespace zero::comm
