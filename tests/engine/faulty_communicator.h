// A communicator wrapper for failure tests: before each collective it sleeps a random while
// (a slow rank) and now and then fails the collective the way a backend error does.
#ifndef ZERO_TESTS_ENGINE_FAULTY_COMMUNICATOR_H_
#define ZERO_TESTS_ENGINE_FAULTY_COMMUNICATOR_H_

#include <chrono>
#include <random>
#include <thread>

#include "tests/engine/forwarding_communicator.h"

namespace zero::testing {

/// Wraps a rank's communicator: before each collective sleeps a random while (a slow rank), and
/// now and then fails the collective the way a backend error does, by issuing it with an
/// invalid buffer (which fails it on every rank and breaks the group).
class FaultyCommunicator final : public ForwardingCommunicator {
 public:
  FaultyCommunicator(comm::Communicator& inner, uint32_t seed, double delay_probability,
                     double failure_probability)
      : ForwardingCommunicator(inner), random_(seed), delay_probability_(delay_probability),
        failure_probability_(failure_probability) {}

  int injected_failures() const { return injected_failures_; }

  comm::WorkPtr ReduceScatter(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op) override {
    return ForwardingCommunicator::ReduceScatter(Disturb(send), recv, count, dtype, op);
  }
  comm::WorkPtr AllGather(const void* send, void* recv, int64_t count, DType dtype, int64_t tag = -1) override {
    return ForwardingCommunicator::AllGather(Disturb(send), recv, count, dtype, tag);
  }
  comm::WorkPtr AllReduce(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op,
                          int64_t tag = -1) override {
    return ForwardingCommunicator::AllReduce(Disturb(send), recv, count, dtype, op, tag);
  }
  comm::WorkPtr Broadcast(void* data, int64_t count, DType dtype, int root, int64_t tag = -1) override {
    return ForwardingCommunicator::Broadcast(const_cast<void*>(Disturb(data)), count, dtype, root, tag);
  }
  comm::WorkPtr Barrier() override {
    Disturb(nullptr);
    return ForwardingCommunicator::Barrier();
  }

 private:
  const void* Disturb(const void* send) {
    std::uniform_real_distribution<double> uniform(0, 1);
    if (uniform(random_) < delay_probability_) {
      std::this_thread::sleep_for(std::chrono::microseconds(random_() % 4000));
    }
    if (send != nullptr && uniform(random_) < failure_probability_) {
      ++injected_failures_;
      return nullptr;
    }
    return send;
  }

  std::mt19937 random_;
  const double delay_probability_, failure_probability_;
  int injected_failures_ = 0;
};

}  // namespace zero::testing

#endif  // ZERO_TESTS_ENGINE_FAULTY_COMMUNICATOR_H_
