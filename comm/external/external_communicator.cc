// The external communicator: collectives run by a table of functions the trainer provides
// (zerort.torch's over torch.distributed, so a torchrun launch trains without MPI).
//
// Each collective goes to one of two channels, ordered streams the table runs on separate
// groups: untagged collectives (gradients, params at stages 0-2) on channel 0, tagged ones
// (stage-3 gathers, host values) on channel 1 after a signature check, an all-gather of every
// rank's signature that must agree before the collective itself starts. A rank's tagged
// collective is therefore never matched with a peer's gradient collective of another size,
// and ranks that diverge in tagged collectives get an error naming both sides.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/raw_memory.h"
#include "comm/group_health.h"
#include "comm/signature_words.h"
#include "zero/communicator.h"
#include "zero/device.h"

namespace zero::comm {
namespace {

// Host memory a collective runs on: copies of its CUDA device buffers (`recv` goes back to
// `device_recv` once the collective is waited for), or a signature check's words.
struct Staging {
  std::vector<char> send, recv;
  void* device_recv = nullptr;
};

// What a communicator and its works share: the table (its context lives as long as any of
// them), the group's health, and what collectives abandoned unfinished leave: whether there
// is one (the table may still touch its buffers) and the host copies it may touch.
struct SharedTable {
  ExternalCollectives table;
  GroupHealth health;
  std::atomic<bool> abandoned_unfinished{false};
  std::mutex kept_mutex;
  std::vector<std::unique_ptr<Staging>> kept;

  // A collective given up before it finished: the table may run it on, into its buffers:
  // `staging`'s host copies, kept here, or (without staging) the caller's own buffers.
  void Abandon(std::unique_ptr<Staging> staging) {
    if (staging == nullptr) {
      abandoned_unfinished = true;
      return;
    }
    std::lock_guard<std::mutex> lock(kept_mutex);
    kept.push_back(std::move(staging));
  }
  ~SharedTable() {
    if (table.destroy) table.destroy();
  }
};

// The buffer sizes of `s` in bytes (send, recv) in the layouts of communicator.h.
std::pair<int64_t, int64_t> BufferBytes(const CollectiveSignature& s, int size) {
  const int64_t bytes = s.count * static_cast<int64_t>(DTypeSize(s.dtype));
  switch (s.kind) {
    case CollectiveKind::kReduceScatter: return {bytes * size, bytes};
    case CollectiveKind::kAllGather: return {bytes, bytes * size};
    case CollectiveKind::kBarrier: return {0, 0};
    default: return {bytes, bytes};
  }
}

// Points `*send`/`*recv` at host copies when either is CUDA device memory (the input copied
// now); `staging` then owns them. Broadcast's one buffer stays one; every other kind gets a
// send and a recv copy of their own sizes, also in place (a reduce-scatter reads size()·count
// from send, which at rank 0 starts where recv does).
Status StageDeviceBuffers(const CollectiveSignature& s, int size, const void** send, void** recv,
                          std::unique_ptr<Staging>* staging) {
  if (s.count == 0 || (PlacementOf(*send) != Placement::kDevice && PlacementOf(*recv) != Placement::kDevice)) {
    return absl::OkStatus();
  }
  const auto [send_bytes, recv_bytes] = BufferBytes(s, size);
  auto staged = std::make_unique<Staging>();
  staged->recv.resize(static_cast<size_t>(recv_bytes));
  staged->device_recv = *recv;
  if (s.kind == CollectiveKind::kBroadcast) {
    ZERO_RETURN_IF_ERROR(base::CopyBytes(staged->recv.data(), *send, recv_bytes));
    *send = staged->recv.data();
  } else {
    staged->send.resize(static_cast<size_t>(send_bytes));
    ZERO_RETURN_IF_ERROR(base::CopyBytes(staged->send.data(), *send, send_bytes));
    *send = staged->send.data();
  }
  *recv = staged->recv.data();
  *staging = std::move(staged);
  return absl::OkStatus();
}

class ExternalWork final : public Work {
 public:
  ExternalWork(std::shared_ptr<SharedTable> shared, int64_t handle, std::string what,
               std::unique_ptr<Staging> staging)
      : shared_(std::move(shared)), handle_(handle), what_(std::move(what)), staging_(std::move(staging)) {}

  ~ExternalWork() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    if (!shared_->table.test(handle_)) {
      shared_->health.Break(absl::CancelledError(absl::StrCat(
          what_, " was abandoned before it completed (its Work was destroyed)")));
      shared_->Abandon(std::move(staging_));
    }
    shared_->table.release(handle_);
  }

  Status Wait(double timeout_s) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return outcome_;
    Status status = shared_->table.wait(handle_, std::min(timeout_s, kLongestWaitSeconds));
    if (status.ok() && staging_ != nullptr) {
      status = base::CopyBytes(staging_->device_recv, staging_->recv.data(),
                               static_cast<int64_t>(staging_->recv.size()));
    }
    if (!status.ok()) {
      status = Status(status.code(), absl::StrCat(what_, ": ", status.message()));
      shared_->health.Break(status);
      if (!shared_->table.test(handle_)) shared_->Abandon(std::move(staging_));  // timed out
    }
    shared_->table.release(handle_);
    finished_ = true;
    outcome_ = std::move(status);
    return outcome_;
  }

  bool Test() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return finished_ || shared_->table.test(handle_);
  }

 private:
  std::shared_ptr<SharedTable> shared_;
  const int64_t handle_;
  const std::string what_;  // "AllReduce(count=4, fp32, sum) (collective #3 on channel 0, rank 1)"
  // Host copies of device buffers (null for host buffers); an abandoned collective hands them
  // to SharedTable::Abandon.
  std::unique_ptr<Staging> staging_;
  std::mutex mutex_;
  bool finished_ = false;
  Status outcome_;
};

class ExternalCommunicator final : public Communicator {
 public:
  ExternalCommunicator(int rank, int size, ExternalOptions options, std::shared_ptr<SharedTable> shared)
      : rank_(rank), size_(size), options_(options), shared_(std::move(shared)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "external"; }
  int ranks_on_this_host() const override { return options_.ranks_on_this_host; }
  Status Health() const override { return shared_->health.Get(); }
  // Only after a collective on the caller's own buffers was abandoned unfinished (a timeout,
  // a Work destroyed early): collectives that never started, or failed, touch nothing, and
  // abandoned host copies (device staging, signature words) are kept by SharedTable.
  bool AbandonedWorkMayTouchBuffers() const override { return shared_->abandoned_unfinished; }

  WorkPtr ReduceScatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    return Start({CollectiveKind::kReduceScatter, count, dtype, op, 0, -1}, send, recv);
  }
  WorkPtr AllGather(const void* send, void* recv, int64_t count, DType dtype, int64_t tag) override {
    return Start({CollectiveKind::kAllGather, count, dtype, ReduceOp::kSum, 0, tag}, send, recv);
  }
  WorkPtr AllReduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                    int64_t tag) override {
    return Start({CollectiveKind::kAllReduce, count, dtype, op, 0, tag}, send, recv);
  }
  WorkPtr Broadcast(void* data, int64_t count, DType dtype, int root, int64_t tag) override {
    return Start({CollectiveKind::kBroadcast, count, dtype, ReduceOp::kSum, root, tag}, data, data);
  }
  WorkPtr Barrier() override { return Start({}, nullptr, nullptr); }

 private:
  // Checks and starts one collective on its channel.
  WorkPtr Start(const CollectiveSignature& s, const void* send, void* recv) {
    const Status valid = ValidateCollective(s, send, recv, size_);
    if (!valid.ok()) return CompletedWork(valid);
    const Status health = shared_->health.Get();
    if (!health.ok()) return CompletedWork(shared_->health.BrokenError(s.ToString().c_str()));
    const int channel = s.tag >= 0 ? 1 : 0;
    const int64_t sequence = ++issued_[channel];
    const std::string what = absl::StrCat(s.ToString(), " (collective #", sequence, " on channel ", channel,
                                          ", rank ", rank_, ")");
    if (channel == 1) {
      const Status agreed = CheckSignature(s, sequence);
      if (!agreed.ok()) {
        shared_->health.Break(agreed);
        return CompletedWork(agreed);
      }
    }
    std::unique_ptr<Staging> staging;
    const Status staged = StageDeviceBuffers(s, size_, &send, &recv, &staging);
    if (!staged.ok()) {  // the peers start it: break the group rather than leave them waiting
      const Status failed(staged.code(), absl::StrCat(what, ": ", staged.message()));
      shared_->health.Break(failed);
      return CompletedWork(failed);
    }
    ExternalCollective collective{s.kind, send, recv, s.count, s.dtype, s.op, s.root, channel};
    StatusOr<int64_t> handle = shared_->table.start(collective);
    if (!handle.ok()) {
      const Status failed(handle.status().code(), absl::StrCat(what, " could not start: ", handle.status().message()));
      shared_->health.Break(failed);
      return CompletedWork(failed);
    }
    return std::make_unique<ExternalWork>(shared_, *handle, what, std::move(staging));
  }

  // Every rank's signature of the channel-1 collective numbered `sequence`, all-gathered on
  // channel 1 and compared with this rank's; waits at most options_.check_timeout_s. The
  // words live in a Staging, which a check given up unfinished hands to Abandon.
  Status CheckSignature(const CollectiveSignature& s, int64_t sequence) {
    auto words = std::make_unique<Staging>();
    words->send.resize(sizeof(int64_t) * kSignatureWords);
    words->recv.resize(sizeof(int64_t) * kSignatureWords * size_);
    int64_t mine[kSignatureWords];
    EncodeSignature(s, mine);
    std::memcpy(words->send.data(), mine, sizeof mine);
    ExternalCollective gather{CollectiveKind::kAllGather, words->send.data(), words->recv.data(), kSignatureWords,
                              DType::kInt64, ReduceOp::kSum, 0, 1};
    StatusOr<int64_t> handle = shared_->table.start(gather);
    if (!handle.ok()) return Annotated(handle.status(), s, sequence);
    Status gathered = shared_->table.wait(*handle, std::min(options_.check_timeout_s, kLongestWaitSeconds));
    if (!gathered.ok() && !shared_->table.test(*handle)) shared_->Abandon(std::move(words));
    shared_->table.release(*handle);
    if (!gathered.ok()) return Annotated(gathered, s, sequence);
    std::vector<int64_t> everyone(static_cast<size_t>(kSignatureWords) * size_);
    std::memcpy(everyone.data(), words->recv.data(), words->recv.size());
    for (int r = 0; r < size_; ++r) {
      const CollectiveSignature theirs = DecodeSignature(&everyone[static_cast<size_t>(r) * kSignatureWords]);
      if (theirs != s) {
        return absl::InvalidArgumentError(absl::StrCat(
            "collective #", sequence, " mismatch: rank ", rank_, " called ", s.ToString(), " but rank ", r,
            " called ", theirs.ToString(), "; all ranks must issue the same collectives in the same order"));
      }
    }
    return absl::OkStatus();
  }

  Status Annotated(const Status& failure, const CollectiveSignature& s, int64_t sequence) const {
    return Status(failure.code(), absl::StrCat("the signature check of ", s.ToString(), " (collective #", sequence,
                                               " on channel 1, rank ", rank_, ") failed: ", failure.message()));
  }

  const int rank_;
  const int size_;
  const ExternalOptions options_;
  std::shared_ptr<SharedTable> shared_;
  int64_t issued_[2] = {0, 0};  // collectives issued per channel
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateExternalCommunicator(int rank, int size,
                                                                   ExternalCollectives collectives,
                                                                   ExternalOptions options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("external communicator: rank ", rank, " of ", size,
                                                   " is not a rank of a group (0 ≤ rank < size, size ≥ 1)"));
  }
  if (!collectives.start || !collectives.wait || !collectives.test || !collectives.release) {
    return absl::InvalidArgumentError(
        "external communicator: the table needs start, wait, test and release functions");
  }
  if (options.ranks_on_this_host < 1 || options.ranks_on_this_host > size) {
    return absl::InvalidArgumentError(absl::StrCat("external communicator: ranks_on_this_host ",
                                                   options.ranks_on_this_host, " is not in [1, ", size, "]"));
  }
  if (!(options.check_timeout_s >= 0)) {
    return absl::InvalidArgumentError("external communicator: check_timeout_s must be ≥ 0 (0: no limit)");
  }
  auto shared = std::make_shared<SharedTable>();
  shared->table = std::move(collectives);
  return std::unique_ptr<Communicator>(new ExternalCommunicator(rank, size, options, std::move(shared)));
}

}  // namespace zero::comm
