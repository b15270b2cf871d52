// A device model for the engine tests: DeviceOps whose work runs only when the host waits for
// it, as a GPU's queued kernels do. The buffers are host memory and the kernels the CPU ones,
// but nothing an asynchronous call queues has happened when it returns: a value the engine
// reads on the host without waiting (Synchronize, Copy, SquaredNorms) is stale, and a
// collective started without the stream wait reads buffers not yet written. Run under it, the
// engine must give the same bits as on the CPU, and every wait it needs shows in host_waits().
#ifndef ZERO_TESTS_ENGINE_DEFERRED_DEVICE_H_
#define ZERO_TESTS_ENGINE_DEFERRED_DEVICE_H_

#include <functional>
#include <memory>
#include <vector>

#include "runtime/device_ops.h"
#include "runtime/engine_impl.h"
#include "zero/communicator.h"

namespace zero::testing {

class DeferredDeviceOps final : public runtime::DeviceOps {
 public:
  explicit DeferredDeviceOps(std::unique_ptr<runtime::DeviceOps> cpu) : cpu_(std::move(cpu)) {}

  /// Runs the queued work without counting a host wait: what the trainer's own kernels,
  /// queued after the engine's on one stream, would see. The first error of queued work.
  Status RunTrainerWork();
  /// Queues `work` (its arguments captured by value) after everything queued so far; it runs
  /// at the next wait. For the stream-ordered communicator.
  Status Queue(std::function<Status()> work);
  /// Calls queued so far and not yet run.
  size_t queued() const { return queue_.size(); }

  Placement placement() const override { return Placement::kHost; }
  Status SetStream(void* stream) override { return cpu_->SetStream(stream); }
  void* stream() const override { return nullptr; }
  Status Synchronize() override;
  bool asynchronous() const override { return true; }
  int64_t host_waits() const override { return host_waits_; }

  Status Zero(void* data, int64_t bytes) override;
  Status Copy(void* destination, const void* source, int64_t bytes) override;
  Status CopyOnDevice(void* destination, const void* source, int64_t bytes) override;
  Status AddInto(void* accumulator, const void* addend, int64_t numel, DType dtype) override;
  Status AddIntoFloat(float* accumulator, const void* addend, int64_t numel, DType addend_dtype) override;
  Status Widen(float* out, const void* in, int64_t numel, DType dtype) override;
  Status Narrow(void* out, const float* in, int64_t numel, DType dtype) override;
  Status AdamStep(const kernels::AdamHyper& hyper, kernels::SegmentTypes types,
                  absl::Span<const kernels::Segment> segments) override;
  Status SgdStep(const kernels::SgdHyper& hyper, kernels::SegmentTypes types,
                 absl::Span<const kernels::Segment> segments) override;
  Status LionStep(const kernels::LionHyper& hyper, kernels::SegmentTypes types,
                  absl::Span<const kernels::Segment> segments) override;
  Status LambUpdate(const kernels::LambHyper& hyper, kernels::SegmentTypes types,
                    absl::Span<const kernels::Segment> segments, absl::Span<float* const> updates) override;
  Status LambApply(const kernels::LambHyper& hyper, DType param_type, absl::Span<const kernels::Segment> segments,
                   absl::Span<const float* const> updates, absl::Span<const float> trust_ratios) override;
  Status SquaredNorms(absl::Span<const kernels::ConstSpan> spans, DType dtype, absl::Span<double> per_span,
                      kernels::NormResult* total) override;
  Status SquaredNormOnDevice(absl::Span<const runtime::NormBatch> batches, float* sq_norm) override;
  Status DecideClip(const float* sq_norm, double divisor, float max_norm, float* grad_norm,
                    float* grad_scale) override;
  /// As on a GPU: the optimizer steps write the squares' partials (the CPU's norm pass, queued
  /// with the step), and SumPartials sums them when the queue reaches it.
  bool squares_in_step() const override { return true; }
  Status SumPartials(const double* partials, int64_t count, float* out) override;

 private:
  // Each chunk's sum of squares of `segments`' gradients into `partials`, in launch order.
  Status WriteSquares(kernels::SegmentTypes types, const std::vector<kernels::Segment>& segments, double* partials);
  // Queues step(hyper, types, segments) with the partials of hyper.common.grad_squares first.
  template <typename Hyper, typename Step>
  Status QueueStep(const Hyper& hyper, kernels::SegmentTypes types, absl::Span<const kernels::Segment> segments,
                   Step step);
  // A wait by the host: counted, then the queue runs.
  Status Wait();

  std::unique_ptr<runtime::DeviceOps> cpu_;
  std::vector<std::function<Status()>> queue_;
  Status failed_;  // the first error of queued work, reported by every later wait (as CUDA's)
  int64_t host_waits_ = 0;
};

/// The in-process communicator `inner` seen from the device model's stream, as NCCL sees a
/// GPU's: each collective starts when the model's queue reaches it (after the work queued
/// before it), Work::WaitOnStream queues a wait for it there, and Work::Wait runs the queue
/// first. `*ops` is the model of the engine using it (set by DeferredDeviceFactory before
/// the engine's first collective).
class StreamOrderedCommunicator final : public comm::Communicator {
 public:
  StreamOrderedCommunicator(comm::Communicator& inner, DeferredDeviceOps* const* ops) : inner_(inner), ops_(ops) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* backend() const override { return inner_.backend(); }
  bool ordered_after_stream() const override { return true; }
  int ranks_on_this_host() const override { return inner_.ranks_on_this_host(); }
  Status Health() const override { return inner_.Health(); }
  comm::WorkPtr ReduceScatter(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op) override;
  comm::WorkPtr AllGather(const void* send, void* recv, int64_t count, DType dtype, int64_t tag = -1) override;
  comm::WorkPtr AllReduce(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op,
                          int64_t tag = -1) override;
  comm::WorkPtr Broadcast(void* data, int64_t count, DType dtype, int root, int64_t tag = -1) override;
  comm::WorkPtr Barrier() override;

 private:
  // Queues `launch` on the model's stream; the Work of the collective it will start.
  comm::WorkPtr OnStream(std::function<comm::WorkPtr(comm::Communicator&)> launch);

  comm::Communicator& inner_;
  DeferredDeviceOps* const* ops_;
};

/// An OpsFactory for runtime::CreateEngine that hands out DeferredDeviceOps over the CPU ops,
/// and keeps a pointer to the one it made in `*made` (owned by the engine).
runtime::OpsFactory DeferredDeviceFactory(DeferredDeviceOps** made);

}  // namespace zero::testing

#endif  // ZERO_TESTS_ENGINE_DEFERRED_DEVICE_H_
