// A communicator wrapper that counts the collectives started, and optionally makes each one
// complete only once it was waited for, as a device that runs queued work only when the host
// waits would: for tests of the engine's host waits and collective counts.
#ifndef ZERO_TESTS_ENGINE_COUNTING_COMMUNICATOR_H_
#define ZERO_TESTS_ENGINE_COUNTING_COMMUNICATOR_H_

#include <memory>
#include <utility>

#include "tests/engine/forwarding_communicator.h"

namespace zero::testing {

/// A collective that reports itself complete only once it was waited for, as a device that
/// runs queued work only when the host waits would.
class LazyWork final : public comm::Work {
 public:
  explicit LazyWork(comm::WorkPtr inner) : inner_(std::move(inner)) {}
  Status Wait(double timeout_s) override {
    waited_ = true;
    return inner_->Wait(timeout_s);
  }
  bool Test() override { return waited_ && inner_->Test(); }

 private:
  comm::WorkPtr inner_;
  bool waited_ = false;
};

/// Passes every call to `inner` and counts the collectives started; with `lazy`, each one's
/// work is a LazyWork.
class CountingCommunicator final : public ForwardingCommunicator {
 public:
  explicit CountingCommunicator(comm::Communicator& inner, bool lazy = false)
      : ForwardingCommunicator(inner), lazy_(lazy) {}
  int collectives() const { return collectives_; }

  comm::WorkPtr ReduceScatter(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op) override {
    return Counted(ForwardingCommunicator::ReduceScatter(send, recv, count, dtype, op));
  }
  comm::WorkPtr AllGather(const void* send, void* recv, int64_t count, DType dtype, int64_t tag = -1) override {
    return Counted(ForwardingCommunicator::AllGather(send, recv, count, dtype, tag));
  }
  comm::WorkPtr AllReduce(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op,
                          int64_t tag = -1) override {
    return Counted(ForwardingCommunicator::AllReduce(send, recv, count, dtype, op, tag));
  }
  comm::WorkPtr Broadcast(void* data, int64_t count, DType dtype, int root, int64_t tag = -1) override {
    return Counted(ForwardingCommunicator::Broadcast(data, count, dtype, root, tag));
  }
  comm::WorkPtr Barrier() override { return Counted(ForwardingCommunicator::Barrier()); }

 private:
  comm::WorkPtr Counted(comm::WorkPtr work) {
    ++collectives_;
    return lazy_ ? std::make_unique<LazyWork>(std::move(work)) : std::move(work);
  }

  const bool lazy_;
  int collectives_ = 0;
};

}  // namespace zero::testing

#endif  // ZERO_TESTS_ENGINE_COUNTING_COMMUNICATOR_H_
