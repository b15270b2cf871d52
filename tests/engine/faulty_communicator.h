// A communicator wrapper for failure tests: before each collective it sleeps a random while
// (a slow rank) and now and then fails the collective the way a backend error does.
#ifndef ZERO_TESTS_ENGINE_FAULTY_COMMUNICATOR_H_
#define ZERO_TESTS_ENGINE_FAULTY_COMMUNICATOR_H_

#include <chrono>
#include <random>
#include <thread>

#include "zero/communicator.h"

namespace zero::testing {

/// Wraps a rank's communicator: before each collective sleeps a random while (a slow rank), and
/// now and then fails the collective the way a backend error does, by issuing it with an
/// invalid buffer (which fails it on every rank and breaks the group).
class FaultyCommunicator final : public comm::Communicator {
 public:
  FaultyCommunicator(comm::Communicator& inner, uint32_t seed, double delay_probability,
                     double failure_probability)
      : inner_(inner), random_(seed), delay_probability_(delay_probability),
        failure_probability_(failure_probability) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* backend() const override { return inner_.backend(); }
  int ranks_on_this_host() const override { return inner_.ranks_on_this_host(); }
  Status Health() const override { return inner_.Health(); }
  bool AbandonedWorkMayTouchBuffers() const override { return inner_.AbandonedWorkMayTouchBuffers(); }
  int injected_failures() const { return injected_failures_; }

  comm::WorkPtr ReduceScatter(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op) override {
    return inner_.ReduceScatter(Disturb(send), recv, count, dtype, op);
  }
  comm::WorkPtr AllGather(const void* send, void* recv, int64_t count, DType dtype, int64_t tag = -1) override {
    return inner_.AllGather(Disturb(send), recv, count, dtype, tag);
  }
  comm::WorkPtr AllReduce(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op,
                          int64_t tag = -1) override {
    return inner_.AllReduce(Disturb(send), recv, count, dtype, op, tag);
  }
  comm::WorkPtr Broadcast(void* data, int64_t count, DType dtype, int root, int64_t tag = -1) override {
    return inner_.Broadcast(const_cast<void*>(Disturb(data)), count, dtype, root, tag);
  }
  comm::WorkPtr Barrier() override {
    Disturb(nullptr);
    return inner_.Barrier();
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

  comm::Communicator& inner_;
  std::mt19937 random_;
  const double delay_probability_, failure_probability_;
  int injected_failures_ = 0;
};

}  // namespace zero::testing

#endif  // ZERO_TESTS_ENGINE_FAULTY_COMMUNICATOR_H_
