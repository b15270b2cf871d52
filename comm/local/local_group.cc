// In-process ranks: each collective is a rendezvous slot that the last arriving rank executes.
// A failed, timed-out or abandoned collective breaks the whole group (comm/group_health.h).
#include "zero/communicator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/completion.h"
#include "comm/group_health.h"
#include "comm/local/arrival.h"
#include "comm/host_reduce.h"
#include "zero/device.h"

namespace zero::comm {
namespace {

// The meeting point of the k-th collective of every rank.
struct Slot {
  explicit Slot(int size, int64_t sequence) : arrivals(size), sequence(sequence) {}
  std::mutex mutex;
  std::condition_variable completed;
  Arrivals arrivals;
  int arrived = 0;
  bool done = false;
  Status status;
  int64_t sequence;
};

const char* ElementBytes(const void* base, int64_t elements, DType dtype) {
  return static_cast<const char*>(base) + elements * static_cast<int64_t>(DTypeSize(dtype));
}
char* ElementBytes(void* base, int64_t elements, DType dtype) {
  return static_cast<char*>(base) + elements * static_cast<int64_t>(DTypeSize(dtype));
}

// Moves the data of a complete, consistent slot of host buffers. Called once, by the last rank
// to arrive.
void ExecuteOnHost(const Arrivals& arrivals) {
  const int size = static_cast<int>(arrivals.size());
  const CollectiveSignature& s = arrivals[0]->signature;
  const size_t chunk_bytes = static_cast<size_t>(s.count) * DTypeSize(s.dtype);
  std::vector<const void*> inputs(size);
  switch (s.kind) {
    case CollectiveKind::kReduceScatter:
      for (int r = 0; r < size; ++r) {
        for (int k = 0; k < size; ++k) inputs[k] = ElementBytes(arrivals[k]->send, r * s.count, s.dtype);
        ReduceInto(arrivals[r]->recv, inputs.data(), size, s.count, s.dtype, s.op);
      }
      return;
    case CollectiveKind::kAllReduce:
      for (int k = 0; k < size; ++k) inputs[k] = arrivals[k]->send;
      ReduceInto(arrivals[0]->recv, inputs.data(), size, s.count, s.dtype, s.op);
      for (int r = 1; r < size; ++r) {
        if (arrivals[r]->recv != arrivals[0]->recv) {
          std::memcpy(arrivals[r]->recv, arrivals[0]->recv, chunk_bytes);
        }
      }
      return;
    case CollectiveKind::kAllGather:
      for (int q = 0; q < size; ++q) {
        for (int i = 0; i < size; ++i) {
          char* destination = ElementBytes(arrivals[q]->recv, i * s.count, s.dtype);
          if (destination != arrivals[i]->send) std::memmove(destination, arrivals[i]->send, chunk_bytes);
        }
      }
      return;
    case CollectiveKind::kBroadcast:
      for (int r = 0; r < size; ++r) {
        if (r != s.root && arrivals[r]->recv != arrivals[s.root]->send) {
          std::memcpy(arrivals[r]->recv, arrivals[s.root]->send, chunk_bytes);
        }
      }
      return;
    case CollectiveKind::kBarrier:
      return;
  }
}

// State shared by the communicators of one group.
class Group {
 public:
  explicit Group(int size) : size_(size) {}
  int size() const { return size_; }
  Status Health() const { return health_.Get(); }

  // Records `rank`'s arrival at collective `sequence`; the last arrival executes it. Null when
  // the group is broken: nothing is recorded and no buffer of this call is ever touched.
  std::shared_ptr<Slot> Arrive(int rank, int64_t sequence, Arrival arrival) {
    std::shared_ptr<Slot> slot;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!health_.Get().ok()) return nullptr;
      auto& entry = slots_[sequence];
      if (entry == nullptr) entry = std::make_shared<Slot>(size_, sequence);
      slot = entry;
    }
    bool last = false;
    Status failed;
    {
      std::lock_guard<std::mutex> lock(slot->mutex);
      if (!slot->done) Check(*slot, rank, arrival);
      slot->arrivals[rank] = std::move(arrival);
      last = ++slot->arrived == size_;
      if (last && !slot->done) {
        if (slot->arrivals[0]->on_device) {
          slot->status = ExecuteOnDevice(slot->arrivals);
        } else {
          ExecuteOnHost(slot->arrivals);
        }
        slot->done = true;
      }
      if (slot->done) failed = slot->status;
    }
    slot->completed.notify_all();
    if (last) {
      std::lock_guard<std::mutex> lock(mutex_);
      slots_.erase(sequence);
    }
    Break(failed);
    return slot;
  }

  // Breaks the group with `cause` (ignored when OK or when already broken): every collective
  // not yet executed fails with it, its waiters wake, and later arrivals are refused. A slot is
  // executed and failed under its own mutex, so each one either ran completely or never runs.
  void Break(const Status& cause) {
    if (cause.ok()) return;
    std::vector<std::shared_ptr<Slot>> pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!health_.Break(cause)) return;
      for (auto& [sequence, slot] : slots_) pending.push_back(slot);
      slots_.clear();
    }
    for (const auto& slot : pending) {
      {
        std::lock_guard<std::mutex> lock(slot->mutex);
        if (slot->done) continue;
        slot->done = true;
        slot->status = cause;
      }
      slot->completed.notify_all();
    }
  }

  Status BrokenError(const char* what) const { return health_.BrokenError(what); }

 private:
  // Fails the slot (and completes it at once, so waiting ranks return) when this arrival is
  // invalid or disagrees with an earlier one.
  void Check(Slot& slot, int rank, const Arrival& arrival) {
    auto fail = [&slot](Status status) {
      slot.status = std::move(status);
      slot.done = true;
    };
    if (!arrival.invalid.ok()) {
      fail(Status(arrival.invalid.code(), absl::StrCat("collective #", slot.sequence, ": rank ",
                                                       rank, "'s call was invalid: ",
                                                       arrival.invalid.message())));
      return;
    }
    for (int other = 0; other < size_; ++other) {
      const auto& earlier = slot.arrivals[other];
      if (earlier.has_value() && earlier->on_device != arrival.on_device) {
        fail(absl::InvalidArgumentError(absl::StrCat(
            "collective #", slot.sequence, ": rank ", other, " passed ", earlier->on_device ? "CUDA device" : "host",
            " buffers but rank ", rank, " passed ", arrival.on_device ? "CUDA device" : "host",
            " buffers; all ranks must use the same kind")));
        return;
      }
      if (earlier.has_value() && earlier->signature != arrival.signature) {
        fail(absl::InvalidArgumentError(absl::StrCat(
            "collective #", slot.sequence, " mismatch: rank ", other, " called ",
            earlier->signature.ToString(), " but rank ", rank, " called ",
            arrival.signature.ToString(), "; all ranks must issue the same collectives in the "
            "same order")));
        return;
      }
    }
  }

  const int size_;
  std::mutex mutex_;
  std::map<int64_t, std::shared_ptr<Slot>> slots_;
  GroupHealth health_;
};

class LocalWork final : public Work {
 public:
  LocalWork(std::shared_ptr<Group> group, std::shared_ptr<Slot> slot, int rank, CollectiveSignature signature)
      : group_(std::move(group)), slot_(std::move(slot)), rank_(rank), signature_(signature) {}

  // An unfinished collective is abandoned: failing its slot guarantees that the last rank to
  // arrive never executes it with this rank's (soon invalid) buffers.
  ~LocalWork() override {
    Status abandoned;
    {
      std::lock_guard<std::mutex> lock(slot_->mutex);
      if (slot_->done) return;
      abandoned = absl::CancelledError(absl::StrCat(
          signature_.ToString(), " (collective #", slot_->sequence, ") was abandoned by rank ", rank_,
          ": its Work was destroyed before the collective completed"));
      slot_->done = true;
      slot_->status = abandoned;
    }
    slot_->completed.notify_all();
    group_->Break(abandoned);
  }

  Status Wait(double timeout_s) override {
    Status outcome;
    {
      std::unique_lock<std::mutex> lock(slot_->mutex);
      if (!WaitUntilDone(slot_->completed, lock, timeout_s, [this] { return slot_->done; })) {
        // Fail the slot while holding its mutex: the late rank will not execute it.
        slot_->done = true;
        slot_->status = Timeout(timeout_s);
      }
      outcome = slot_->status;
    }
    slot_->completed.notify_all();
    group_->Break(outcome);
    return outcome;
  }

  bool Test() override {
    std::lock_guard<std::mutex> lock(slot_->mutex);
    return slot_->done;
  }

 private:
  // Called with the slot locked. Every rank that waited reads this one status, so it names the
  // rank that timed out first as that, not as the reader.
  Status Timeout(double timeout_s) const {
    std::vector<int> missing;
    for (size_t r = 0; r < slot_->arrivals.size(); ++r) {
      if (!slot_->arrivals[r].has_value()) missing.push_back(static_cast<int>(r));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        signature_.ToString(), " (collective #", slot_->sequence, ") in the group of ",
        slot_->arrivals.size(), " ranks did not complete within ", timeout_s, " s on rank ", rank_,
        ", the first to time out: rank(s) ",
        absl::StrJoin(missing, ", "), " never joined it (diverged, stuck, or failed earlier)"));
  }

  std::shared_ptr<Group> group_;
  std::shared_ptr<Slot> slot_;
  int rank_;
  CollectiveSignature signature_;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const char* backend() const override { return "local"; }
  int ranks_on_this_host() const override { return group_->size(); }
  Status Health() const override { return group_->Health(); }
  bool AbandonedWorkMayTouchBuffers() const override { return false; }

  WorkPtr ReduceScatter(const void* send, void* recv, int64_t count, DType dtype,
                        ReduceOp op) override {
    return Post({CollectiveKind::kReduceScatter, count, dtype, op, 0}, send, recv);
  }
  WorkPtr AllGather(const void* send, void* recv, int64_t count, DType dtype, int64_t tag = -1) override {
    return Post({CollectiveKind::kAllGather, count, dtype, ReduceOp::kSum, 0, tag}, send, recv);
  }
  WorkPtr AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                    ReduceOp op, int64_t tag = -1) override {
    return Post({CollectiveKind::kAllReduce, count, dtype, op, 0, tag}, send, recv);
  }
  WorkPtr Broadcast(void* data, int64_t count, DType dtype, int root, int64_t tag = -1) override {
    return Post({CollectiveKind::kBroadcast, count, dtype, ReduceOp::kSum, root, tag}, data, data);
  }
  WorkPtr Barrier() override {
    return Post({CollectiveKind::kBarrier, 0, DType::kFP32, ReduceOp::kSum, 0}, nullptr, nullptr);
  }

 private:
  WorkPtr Post(const CollectiveSignature& signature, const void* send, void* recv) {
    const bool send_device = PlacementOf(send) == Placement::kDevice;
    const bool recv_device = PlacementOf(recv) == Placement::kDevice;
    Arrival arrival{signature, send, recv, send_device || recv_device,
                    ValidateCollective(signature, send, recv, size())};
    if (arrival.invalid.ok() && signature.kind != CollectiveKind::kBarrier && send_device != recv_device) {
      arrival.invalid = absl::InvalidArgumentError(absl::StrCat(
          signature.ToString(), ": one buffer is CUDA device memory and the other host memory; "
          "pass both on the same side"));
    }
    auto slot = group_->Arrive(rank_, next_sequence_++, std::move(arrival));
    if (slot == nullptr) return CompletedWork(group_->BrokenError(signature.ToString().c_str()));
    return std::make_unique<LocalWork>(group_, std::move(slot), rank_, signature);
  }

  std::shared_ptr<Group> group_;
  int rank_;
  int64_t next_sequence_ = 0;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateLocalGroup(int size) {
  if (size < 1 || size > kMaxLocalGroupSize) {
    return absl::InvalidArgumentError(absl::StrCat("local group size ", size, " must be 1 to ", kMaxLocalGroupSize,
                                                   " (in-process ranks are threads of one process; more ranks run as "
                                                   "processes under mpirun)"));
  }
  auto group = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<Communicator>> communicators;
  for (int r = 0; r < size; ++r) communicators.push_back(std::make_unique<LocalCommunicator>(group, r));
  return communicators;
}

}  // namespace zero::comm
