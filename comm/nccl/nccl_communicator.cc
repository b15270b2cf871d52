// NCCL communicator on a dedicated stream, ordered after the trainer's stream with events; a
// stream can wait for a collective's done event (Work::WaitOnStream), watched by the watchdog.
// A failed or timed-out collective breaks the group: the communicator is aborted at once
// (ncclCommAbort ends its kernels, so no buffer is touched afterwards) and every later call
// fails with the first error.
#include "zero/communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_converters.h"
#include "comm/group_health.h"
#include "comm/nccl/nccl_watchdog.h"
#include "zero/device.h"

namespace zero::comm {
namespace {

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFP32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kFP16: return ncclFloat16;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

// The NCCL communicator and whether it was aborted, shared by the communicator and its works.
// How long an abort waits for a call into NCCL to return before aborting anyway (a launch
// stuck on a peer that never connects is released only by the abort).
constexpr std::chrono::seconds kAbortGrace(2);
// How long the watchdog's poll of NCCL's asynchronous error waits for a call to return.
constexpr std::chrono::milliseconds kPollGrace(50);
// How long destroying a healthy communicator waits for its collectives still on its stream
// (a peer that never joins one would otherwise hang the destructor).
constexpr std::chrono::seconds kDrainLimit(60);

// The watchdog thread may abort the NCCL communicator while the caller's thread uses it: the
// caller uses it only while holding `use` and only while the group is healthy, and an abort
// first marks the group broken, then takes `use` (or gives up waiting after kAbortGrace).
struct NcclGroup {
  ncclComm_t comm = nullptr;
  GroupHealth health;
  std::timed_mutex use;
  // Watches the collectives streams wait for; stopped before the communicator is destroyed.
  std::unique_ptr<NcclWatchdog> watchdog;
  // Breaks the group with `cause`; the call that breaks it aborts the NCCL communicator.
  void Break(const Status& cause) {
    if (cause.ok() || !health.Break(cause)) return;
    std::unique_lock<std::timed_mutex> lock(use, std::defer_lock);
    (void)lock.try_lock_for(kAbortGrace);
    ncclCommAbort(comm);
  }
  // NCCL's asynchronous error as a Status; the group's error once it broke; OK when a call
  // into NCCL keeps the communicator busy (the next poll asks again).
  Status AsyncError() {
    std::unique_lock<std::timed_mutex> lock(use, std::defer_lock);
    if (!lock.try_lock_for(kPollGrace)) return absl::OkStatus();
    ZERO_RETURN_IF_ERROR(health.Get());
    ncclResult_t async = ncclSuccess;
    ZERO_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &async));
    ZERO_NCCL_RETURN_IF_ERROR(async);
    return absl::OkStatus();
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclGroup> group, std::shared_ptr<DoneEvent> done)
      : group_(std::move(group)), done_(std::move(done)) {}
  ~NcclWork() override {
    if (group_->health.Get().ok() && cudaEventQuery(done_->event) == cudaErrorNotReady) {
      group_->Break(absl::CancelledError(absl::StrCat(
          done_->what, " was abandoned: its Work was destroyed before the collective completed")));
    }
  }

  Status Wait(double timeout_s) override {
    Status status = Poll(timeout_s);
    group_->Break(status);
    return status;
  }

  bool Test() override { return !group_->health.Get().ok() || cudaEventQuery(done_->event) != cudaErrorNotReady; }

  Status WaitOnStream(void* stream, double timeout_s) override {
    if (!group_->health.Get().ok()) return group_->health.BrokenError(done_->what.c_str());
    ZERO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_->event, 0));
    if (timeout_s > 0 && group_->watchdog != nullptr) group_->watchdog->Watch(done_, timeout_s);
    return absl::OkStatus();
  }

 private:
  Status Poll(double timeout_s) const {
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      if (!group_->health.Get().ok()) return group_->health.BrokenError(done_->what.c_str());
      const cudaError_t state = cudaEventQuery(done_->event);
      if (state == cudaSuccess) return group_->AsyncError();
      if (state != cudaErrorNotReady) {
        return internal::CudaError(state, cudaGetErrorName(state), cudaGetErrorString(state),
                                   "cudaEventQuery(done)", __FILE__, __LINE__);
      }
      ZERO_RETURN_IF_ERROR(group_->AsyncError());
      const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
      if (timeout_s > 0 && waited.count() > timeout_s) {
        return absl::DeadlineExceededError(absl::StrCat(
            done_->what, " did not complete within ", timeout_s, " s: a peer rank never joined it"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  std::shared_ptr<NcclGroup> group_;
  std::shared_ptr<DoneEvent> done_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int ranks_on_this_host, int device, cudaStream_t caller,
                   cudaStream_t own, cudaEvent_t ready, float* scratch)
      : group_(std::make_shared<NcclGroup>()), events_(std::make_shared<EventPool>()), comm_(comm), rank_(rank),
        size_(size), ranks_on_this_host_(ranks_on_this_host), caller_(caller), own_(own), ready_(ready),
        scratch_(scratch) {
    group_->comm = comm;
    NcclGroup* group = group_.get();  // the watchdog lives inside it
    group_->watchdog = std::make_unique<NcclWatchdog>(
        device, [group](const Status& cause) { group->Break(cause); }, [group] { return group->AsyncError(); });
  }

  ~NcclCommunicator() override {
    group_->watchdog.reset();  // stopped (joined) before the NCCL communicator can go
    if (group_->health.Get().ok()) {
      if (Status drained = DrainOwnStream(); drained.ok()) {
        ncclCommDestroy(comm_);
      } else {
        group_->Break(drained);  // aborts: its kernels end, nothing waits for a peer
      }
    }  // else ncclCommAbort already ended its kernels and freed it
    cudaStreamDestroy(own_);
    cudaEventDestroy(ready_);
    cudaFree(scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  int ranks_on_this_host() const override { return ranks_on_this_host_; }
  bool device_buffers_only() const override { return true; }
  bool ordered_after_stream() const override { return true; }
  void* stream() const override { return caller_; }
  Status Health() const override { return group_->health.Get(); }
  bool AbandonedWorkMayTouchBuffers() const override { return false; }

  WorkPtr ReduceScatter(const void* send, void* recv, int64_t count, DType dtype,
                        ReduceOp op) override {
    return Run({CollectiveKind::kReduceScatter, count, dtype, op, 0}, send, recv, [&] {
      return ncclReduceScatter(send, recv, count, NcclType(dtype), NcclOp(op), comm_, own_);
    });
  }
  WorkPtr AllGather(const void* send, void* recv, int64_t count, DType dtype, int64_t tag = -1) override {
    return Run({CollectiveKind::kAllGather, count, dtype, ReduceOp::kSum, 0, tag}, send, recv, [&] {
      return ncclAllGather(send, recv, count, NcclType(dtype), comm_, own_);
    });
  }
  WorkPtr AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                    ReduceOp op, int64_t tag = -1) override {
    return Run({CollectiveKind::kAllReduce, count, dtype, op, 0, tag}, send, recv, [&] {
      return ncclAllReduce(send, recv, count, NcclType(dtype), NcclOp(op), comm_, own_);
    });
  }
  WorkPtr Broadcast(void* data, int64_t count, DType dtype, int root, int64_t tag = -1) override {
    return Run({CollectiveKind::kBroadcast, count, dtype, ReduceOp::kSum, root, tag}, data, data, [&] {
      return ncclBroadcast(data, data, count, NcclType(dtype), root, comm_, own_);
    });
  }
  WorkPtr Barrier() override {
    return Run({CollectiveKind::kBarrier, 0, DType::kFP32, ReduceOp::kSum, 0}, nullptr, nullptr,
               [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, own_); });
  }

 private:
  // Waits, at most kDrainLimit, for the collectives on the own stream; an error when one
  // failed (NCCL's asynchronous error) or did not complete in time.
  Status DrainOwnStream() {
    const auto deadline = std::chrono::steady_clock::now() + kDrainLimit;
    while (true) {
      const cudaError_t state = cudaStreamQuery(own_);
      if (state == cudaSuccess) return absl::OkStatus();
      if (state != cudaErrorNotReady) {
        return internal::CudaError(state, cudaGetErrorName(state), cudaGetErrorString(state),
                                   "cudaStreamQuery(own)", __FILE__, __LINE__);
      }
      ZERO_RETURN_IF_ERROR(group_->AsyncError());
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the NCCL communicator was destroyed while a collective was still in flight after ",
            kDrainLimit.count(), " s: a peer rank never joined it"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  template <typename Launch>
  WorkPtr Run(const CollectiveSignature& s, const void* a, const void* b, Launch launch) {
    if (!group_->health.Get().ok()) return CompletedWork(group_->health.BrokenError(s.ToString().c_str()));
    StatusOr<cudaEvent_t> done = Enqueue(s, a, b, launch);
    if (!done.ok()) {
      group_->Break(done.status());
      return CompletedWork(done.status());
    }
    return std::make_unique<NcclWork>(
        group_, std::make_shared<DoneEvent>(events_, *done,
                                            absl::StrCat("NCCL ", s.ToString(), " (collective #", next_sequence_++,
                                                         ") on rank ", rank_, " of ", size_)));
  }

  template <typename Launch>
  StatusOr<cudaEvent_t> Enqueue(const CollectiveSignature& s, const void* a, const void* b,
                                Launch launch) {
    ZERO_RETURN_IF_ERROR(ValidateCollective(s, a, b, size_));
    if (s.kind != CollectiveKind::kBarrier && s.count > 0 &&
        (PlacementOf(a) != Placement::kDevice || PlacementOf(b) != Placement::kDevice)) {
      return absl::InvalidArgumentError(
          absl::StrCat(s.ToString(), ": the nccl communicator needs CUDA device buffers"));
    }
    std::lock_guard<std::timed_mutex> lock(group_->use);  // an abort waits for this call
    if (!group_->health.Get().ok()) return group_->health.BrokenError(s.ToString().c_str());
    // One ready event serves every collective: a stream wait takes the event as last recorded.
    ZERO_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_, caller_));
    ZERO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(own_, ready_, 0));
    ZERO_NCCL_RETURN_IF_ERROR(launch());
    ZERO_ASSIGN_OR_RETURN(cudaEvent_t done, events_->Take());
    const cudaError_t recorded = cudaEventRecord(done, own_);
    if (recorded != cudaSuccess) {
      events_->Give(done);
      ZERO_CUDA_RETURN_IF_ERROR(recorded);
    }
    return done;
  }

  std::shared_ptr<NcclGroup> group_;
  std::shared_ptr<EventPool> events_;  // done events; outlive the works that hold them
  ncclComm_t comm_;
  const int rank_, size_, ranks_on_this_host_;
  cudaStream_t caller_, own_;
  cudaEvent_t ready_;  // recorded on the caller's stream before each collective
  float* scratch_;
  int64_t next_sequence_ = 0;
};

}  // namespace

bool NcclAvailable() { return true; }

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap,
                                                               NcclOptions options) {
  if (CudaDeviceCount() == 0) {
    return absl::UnavailableError("the nccl communicator needs a CUDA device; none is visible");
  }
  if (options.device >= 0) ZERO_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) ZERO_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  ZERO_RETURN_IF_ERROR(bootstrap.Broadcast(&id, sizeof(ncclUniqueId), DType::kUInt8, 0, kHostValuesTag)->Wait());
  ncclComm_t comm = nullptr;
  ZERO_NCCL_RETURN_IF_ERROR(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  cudaStream_t own = nullptr;
  cudaEvent_t ready = nullptr;
  float* scratch = nullptr;
  int device = 0;
  ZERO_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  ZERO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  ZERO_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch, sizeof(float)));
  return std::unique_ptr<Communicator>(new NcclCommunicator(
      comm, bootstrap.rank(), bootstrap.size(), bootstrap.ranks_on_this_host(), device,
      static_cast<cudaStream_t>(options.stream), own, ready, scratch));
}

}  // namespace zero::comm
