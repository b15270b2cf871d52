// A communicator that passes every call to another one: the base of the test wrappers that
// change a few calls (random delays and failures, counting, holding a Work back).
#ifndef ZERO_TESTS_ENGINE_FORWARDING_COMMUNICATOR_H_
#define ZERO_TESTS_ENGINE_FORWARDING_COMMUNICATOR_H_

#include "zero/communicator.h"

namespace zero::testing {

/// Forwards every call to `inner`; a wrapper overrides what it changes.
class ForwardingCommunicator : public comm::Communicator {
 public:
  explicit ForwardingCommunicator(comm::Communicator& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* backend() const override { return inner_.backend(); }
  int ranks_on_this_host() const override { return inner_.ranks_on_this_host(); }
  Status Health() const override { return inner_.Health(); }
  bool AbandonedWorkMayTouchBuffers() const override { return inner_.AbandonedWorkMayTouchBuffers(); }
  comm::WorkPtr ReduceScatter(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op) override {
    return inner_.ReduceScatter(send, recv, count, dtype, op);
  }
  comm::WorkPtr AllGather(const void* send, void* recv, int64_t count, DType dtype, int64_t tag = -1) override {
    return inner_.AllGather(send, recv, count, dtype, tag);
  }
  comm::WorkPtr AllReduce(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op,
                          int64_t tag = -1) override {
    return inner_.AllReduce(send, recv, count, dtype, op, tag);
  }
  comm::WorkPtr Broadcast(void* data, int64_t count, DType dtype, int root, int64_t tag = -1) override {
    return inner_.Broadcast(data, count, dtype, root, tag);
  }
  comm::WorkPtr Barrier() override { return inner_.Barrier(); }

 private:
  comm::Communicator& inner_;
};

}  // namespace zero::testing

#endif  // ZERO_TESTS_ENGINE_FORWARDING_COMMUNICATOR_H_
