// DeferredDeviceOps: every asynchronous call becomes a closure over copies of its arguments.
#include "tests/engine/deferred_device.h"

#include <algorithm>
#include <utility>

#include "kernels/launch_table.h"

namespace zero::testing {

Status DeferredDeviceOps::Queue(std::function<Status()> work) {
  if (!failed_.ok()) return failed_;
  queue_.push_back(std::move(work));
  return absl::OkStatus();
}

Status DeferredDeviceOps::RunTrainerWork() {
  std::vector<std::function<Status()>> work;
  work.swap(queue_);
  for (auto& call : work) {
    if (failed_.ok()) failed_ = call();
  }
  return failed_;
}

Status DeferredDeviceOps::Wait() {
  ++host_waits_;
  return RunTrainerWork();
}

Status DeferredDeviceOps::Synchronize() { return Wait(); }

Status DeferredDeviceOps::Zero(void* data, int64_t bytes) {
  return Queue([=] { return cpu_->Zero(data, bytes); });
}

Status DeferredDeviceOps::Copy(void* destination, const void* source, int64_t bytes) {
  ZERO_RETURN_IF_ERROR(Wait());  // the destination holds the values on return
  return cpu_->Copy(destination, source, bytes);
}

Status DeferredDeviceOps::CopyOnDevice(void* destination, const void* source, int64_t bytes) {
  return Queue([=] { return cpu_->CopyOnDevice(destination, source, bytes); });
}

Status DeferredDeviceOps::AddInto(void* accumulator, const void* addend, int64_t numel, DType dtype) {
  return Queue([=] { return cpu_->AddInto(accumulator, addend, numel, dtype); });
}

Status DeferredDeviceOps::AddIntoFloat(float* accumulator, const void* addend, int64_t numel, DType addend_dtype) {
  return Queue([=] { return cpu_->AddIntoFloat(accumulator, addend, numel, addend_dtype); });
}

Status DeferredDeviceOps::Widen(float* out, const void* in, int64_t numel, DType dtype) {
  return Queue([=] { return cpu_->Widen(out, in, numel, dtype); });
}

Status DeferredDeviceOps::Narrow(void* out, const float* in, int64_t numel, DType dtype) {
  return Queue([=] { return cpu_->Narrow(out, in, numel, dtype); });
}

Status DeferredDeviceOps::WriteSquares(kernels::SegmentTypes types, const std::vector<kernels::Segment>& segments,
                                       double* partials) {
  // One partial per chunk of each non-empty segment, in order (kernels::LaunchBlocks of them),
  // as the CUDA kernels write them: each chunk as a span of its own.
  std::vector<kernels::ConstSpan> chunks;
  for (const kernels::Segment& s : segments) {
    const int64_t bytes = static_cast<int64_t>(DTypeSize(types.grad));
    for (int64_t at = 0; at < s.numel; at += kernels::kChunkElems) {
      chunks.push_back({static_cast<const char*>(s.grad) + at * bytes, std::min(kernels::kChunkElems, s.numel - at)});
    }
  }
  kernels::NormResult total;
  return cpu_->SquaredNorms(chunks, types.grad, absl::MakeSpan(partials, chunks.size()), &total);
}

template <typename Hyper, typename Step>
Status DeferredDeviceOps::QueueStep(const Hyper& hyper, kernels::SegmentTypes types,
                                    absl::Span<const kernels::Segment> segments, Step step) {
  std::vector<kernels::Segment> copy(segments.begin(), segments.end());
  return Queue([=] {
    Hyper cpu_hyper = hyper;
    if (cpu_hyper.common.grad_squares != nullptr) {  // the CPU loops take them in a pass before
      ZERO_RETURN_IF_ERROR(WriteSquares(types, copy, cpu_hyper.common.grad_squares));
      cpu_hyper.common.grad_squares = nullptr;
    }
    return step(cpu_hyper, types, copy);
  });
}

Status DeferredDeviceOps::AdamStep(const kernels::AdamHyper& hyper, kernels::SegmentTypes types,
                                   absl::Span<const kernels::Segment> segments) {
  return QueueStep(hyper, types, segments, [this](const auto& h, auto t, const auto& s) {
    return cpu_->AdamStep(h, t, s);
  });
}

Status DeferredDeviceOps::SgdStep(const kernels::SgdHyper& hyper, kernels::SegmentTypes types,
                                  absl::Span<const kernels::Segment> segments) {
  return QueueStep(hyper, types, segments, [this](const auto& h, auto t, const auto& s) {
    return cpu_->SgdStep(h, t, s);
  });
}

Status DeferredDeviceOps::LionStep(const kernels::LionHyper& hyper, kernels::SegmentTypes types,
                                   absl::Span<const kernels::Segment> segments) {
  return QueueStep(hyper, types, segments, [this](const auto& h, auto t, const auto& s) {
    return cpu_->LionStep(h, t, s);
  });
}

Status DeferredDeviceOps::SumPartials(const double* partials, int64_t count, float* out) {
  return Queue([=] {
    double sum = 0.0;
    for (int64_t i = 0; i < count; ++i) sum += partials[i];
    *out = static_cast<float>(sum);
    return absl::OkStatus();
  });
}

Status DeferredDeviceOps::LambUpdate(const kernels::LambHyper& hyper, kernels::SegmentTypes types,
                                     absl::Span<const kernels::Segment> segments,
                                     absl::Span<float* const> updates) {
  std::vector<kernels::Segment> segments_copy(segments.begin(), segments.end());
  std::vector<float*> updates_copy(updates.begin(), updates.end());
  return Queue([=] { return cpu_->LambUpdate(hyper, types, segments_copy, updates_copy); });
}

Status DeferredDeviceOps::LambApply(const kernels::LambHyper& hyper, DType param_type,
                                    absl::Span<const kernels::Segment> segments,
                                    absl::Span<const float* const> updates, absl::Span<const float> trust_ratios) {
  std::vector<kernels::Segment> segments_copy(segments.begin(), segments.end());
  std::vector<const float*> updates_copy(updates.begin(), updates.end());
  std::vector<float> ratios(trust_ratios.begin(), trust_ratios.end());
  return Queue([=] { return cpu_->LambApply(hyper, param_type, segments_copy, updates_copy, ratios); });
}

Status DeferredDeviceOps::SquaredNorms(absl::Span<const kernels::ConstSpan> spans, DType dtype,
                                       absl::Span<double> per_span, kernels::NormResult* total) {
  ZERO_RETURN_IF_ERROR(Wait());  // the values are delivered to the host
  return cpu_->SquaredNorms(spans, dtype, per_span, total);
}

Status DeferredDeviceOps::SquaredNormOnDevice(absl::Span<const runtime::NormBatch> batches, float* sq_norm) {
  // The batches' spans are the caller's: copied, with the batches pointing into the copies.
  auto spans = std::make_shared<std::vector<std::vector<kernels::ConstSpan>>>();
  std::vector<DType> dtypes;
  for (const runtime::NormBatch& batch : batches) {
    spans->emplace_back(batch.spans.begin(), batch.spans.end());
    dtypes.push_back(batch.dtype);
  }
  return Queue([this, spans, dtypes, sq_norm] {
    std::vector<runtime::NormBatch> copies;
    for (size_t k = 0; k < spans->size(); ++k) copies.push_back({(*spans)[k], dtypes[k]});
    return cpu_->SquaredNormOnDevice(copies, sq_norm);
  });
}

Status DeferredDeviceOps::DecideClip(const float* sq_norm, double divisor, float max_norm, float* grad_norm,
                                     float* grad_scale) {
  return Queue([=] { return cpu_->DecideClip(sq_norm, divisor, max_norm, grad_norm, grad_scale); });
}

namespace {

// The collective a StreamOrderedCommunicator queued: started once the queue reached it.
struct Queued {
  comm::WorkPtr inner;
};

class StreamWork final : public comm::Work {
 public:
  StreamWork(std::shared_ptr<Queued> queued, DeferredDeviceOps& ops) : queued_(std::move(queued)), ops_(ops) {}

  Status Wait(double timeout_s) override {
    ZERO_RETURN_IF_ERROR(ops_.RunTrainerWork());  // the host wait itself is the caller's to count
    if (queued_->inner == nullptr) return absl::InternalError("a queued collective did not start");
    return queued_->inner->Wait(timeout_s);
  }
  bool Test() override { return queued_->inner != nullptr && queued_->inner->Test(); }
  Status WaitOnStream(void*, double timeout_s) override {
    return ops_.Queue([queued = queued_, timeout_s] { return queued->inner->Wait(timeout_s); });
  }

 private:
  std::shared_ptr<Queued> queued_;
  DeferredDeviceOps& ops_;
};

}  // namespace

comm::WorkPtr StreamOrderedCommunicator::OnStream(std::function<comm::WorkPtr(comm::Communicator&)> launch) {
  DeferredDeviceOps* ops = *ops_;
  if (ops == nullptr) return comm::CompletedWork(absl::FailedPreconditionError("no device model yet"));
  auto queued = std::make_shared<Queued>();
  const Status status = ops->Queue([this, queued, launch = std::move(launch)] {
    queued->inner = launch(inner_);
    return absl::OkStatus();
  });
  if (!status.ok()) return comm::CompletedWork(status);
  return std::make_unique<StreamWork>(queued, *ops);
}

comm::WorkPtr StreamOrderedCommunicator::ReduceScatter(const void* send, void* recv, int64_t count, DType dtype,
                                                       comm::ReduceOp op) {
  return OnStream([=](comm::Communicator& c) { return c.ReduceScatter(send, recv, count, dtype, op); });
}

comm::WorkPtr StreamOrderedCommunicator::AllGather(const void* send, void* recv, int64_t count, DType dtype,
                                                   int64_t tag) {
  return OnStream([=](comm::Communicator& c) { return c.AllGather(send, recv, count, dtype, tag); });
}

comm::WorkPtr StreamOrderedCommunicator::AllReduce(const void* send, void* recv, int64_t count, DType dtype,
                                                   comm::ReduceOp op, int64_t tag) {
  return OnStream([=](comm::Communicator& c) { return c.AllReduce(send, recv, count, dtype, op, tag); });
}

comm::WorkPtr StreamOrderedCommunicator::Broadcast(void* data, int64_t count, DType dtype, int root,
                                                   int64_t tag) {
  return OnStream([=](comm::Communicator& c) { return c.Broadcast(data, count, dtype, root, tag); });
}

comm::WorkPtr StreamOrderedCommunicator::Barrier() {
  return OnStream([](comm::Communicator& c) { return c.Barrier(); });
}

runtime::OpsFactory DeferredDeviceFactory(DeferredDeviceOps** made) {
  return [made](Device, const kernels::CpuExec& exec,
                base::Allocator allocator) -> StatusOr<std::unique_ptr<runtime::DeviceOps>> {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<runtime::DeviceOps> cpu,
                          runtime::DeviceOps::Create(Device::kCpu, exec, allocator));
    auto ops = std::make_unique<DeferredDeviceOps>(std::move(cpu));
    *made = ops.get();
    return std::unique_ptr<runtime::DeviceOps>(std::move(ops));
  };
}

}  // namespace zero::testing
