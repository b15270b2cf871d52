// DeviceOps::Create and the "cpu" operations: host memory and the vectorised CPU kernels.
#include "runtime/device_ops.h"

#include <cstring>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/norms.h"
#include "kernels/cpu/optimizers.h"
#include "kernels/step_decision.h"
#include "base/raw_memory.h"

namespace zero::runtime {
namespace {

class CpuDeviceOps final : public DeviceOps {
 public:
  CpuDeviceOps(const kernels::CpuExec& exec, base::Allocator allocator) : exec_(exec), allocator_(allocator) {}

  Placement placement() const override { return Placement::kHost; }
  Status SetStream(void* stream) override {
    if (stream == nullptr) return absl::OkStatus();
    return absl::InvalidArgumentError("SetStream: the engine runs on device \"cpu\"; a CUDA stream needs \"device\": \"cuda\"");
  }
  void* stream() const override { return nullptr; }
  Status Synchronize() override { return absl::OkStatus(); }
  bool asynchronous() const override { return false; }
  int64_t host_waits() const override { return 0; }

  Status Zero(void* data, int64_t bytes) override {
    if (bytes > 0) std::memset(data, 0, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  Status Copy(void* destination, const void* source, int64_t bytes) override {
    return base::CopyBytes(destination, source, bytes);  // the trainer's pointer may be on a GPU
  }
  Status CopyOnDevice(void* destination, const void* source, int64_t bytes) override {
    if (bytes > 0) std::memcpy(destination, source, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  Status AddInto(void* accumulator, const void* addend, int64_t numel, DType dtype) override {
    kernels::AddIntoCpu(accumulator, addend, numel, dtype);
    return absl::OkStatus();
  }
  Status AddIntoFloat(float* accumulator, const void* addend, int64_t numel, DType addend_dtype) override {
    kernels::AddIntoFloatCpu(accumulator, addend, numel, addend_dtype);
    return absl::OkStatus();
  }
  Status Widen(float* out, const void* in, int64_t numel, DType dtype) override {
    kernels::WidenCpu(out, in, numel, dtype);
    return absl::OkStatus();
  }
  Status Narrow(void* out, const float* in, int64_t numel, DType dtype) override {
    kernels::NarrowCpu(out, in, numel, dtype);
    return absl::OkStatus();
  }

  Status AdamStep(const kernels::AdamHyper& h, kernels::SegmentTypes types,
                  absl::Span<const kernels::Segment> segments) override {
    return kernels::AdamStepCpu(h, types, segments, exec_);
  }
  Status SgdStep(const kernels::SgdHyper& h, kernels::SegmentTypes types,
                 absl::Span<const kernels::Segment> segments) override {
    return kernels::SgdStepCpu(h, types, segments, exec_);
  }
  Status LionStep(const kernels::LionHyper& h, kernels::SegmentTypes types,
                  absl::Span<const kernels::Segment> segments) override {
    return kernels::LionStepCpu(h, types, segments, exec_);
  }
  Status LambUpdate(const kernels::LambHyper& h, kernels::SegmentTypes types,
                    absl::Span<const kernels::Segment> segments, absl::Span<float* const> updates) override {
    return kernels::LambUpdateCpu(h, types, segments, updates, exec_);
  }
  Status LambApply(const kernels::LambHyper& h, DType param_type, absl::Span<const kernels::Segment> segments,
                   absl::Span<const float* const> updates, absl::Span<const float> trust_ratios) override {
    return kernels::LambApplyCpu(h, param_type, segments, updates, trust_ratios, exec_);
  }
  Status SquaredNorms(absl::Span<const kernels::ConstSpan> spans, DType dtype, absl::Span<double> per_span,
                      kernels::NormResult* total) override {
    size_t bytes = 0;
    ZERO_RETURN_IF_ERROR(kernels::SquaredNormsCpu(nullptr, &bytes, spans, dtype, {}, nullptr, exec_));
    if (static_cast<int64_t>(bytes) > workspace_.bytes()) {
      workspace_.Reset();
      ZERO_ASSIGN_OR_RETURN(workspace_, allocator_.Allocate(static_cast<int64_t>(bytes), MemoryCategory::kWorkspace,
                                                            Placement::kHost));
    }
    bytes = static_cast<size_t>(workspace_.bytes());
    return kernels::SquaredNormsCpu(workspace_.data(), &bytes, spans, dtype, per_span, total, exec_);
  }
  Status SquaredNormOnDevice(absl::Span<const NormBatch> batches, float* sq_norm) override {
    double sum = 0.0;
    for (const NormBatch& batch : batches) {
      kernels::NormResult part;
      ZERO_RETURN_IF_ERROR(SquaredNorms(batch.spans, batch.dtype, {}, &part));
      sum += part.sq_norm;
    }
    *sq_norm = static_cast<float>(sum);
    return absl::OkStatus();
  }
  Status DecideClip(const float* sq_norm, double divisor, float max_norm, float* grad_norm,
                    float* grad_scale) override {
    const kernels::ClipDecision decision = kernels::DecideClip(*sq_norm, divisor, max_norm);
    *grad_norm = decision.grad_norm;
    *grad_scale = decision.grad_scale;
    return absl::OkStatus();
  }

 private:
  const kernels::CpuExec exec_;
  base::Allocator allocator_;
  base::Buffer workspace_;
};

}  // namespace

Status DeviceOps::SumPartials(const double*, int64_t, float*) {
  return absl::UnimplementedError(
      "DeviceOps::SumPartials: this device's optimizer kernels sum no squares as they step "
      "(squares_in_step() is false)");
}

StatusOr<std::unique_ptr<DeviceOps>> DeviceOps::Create(Device device, const kernels::CpuExec& exec,
                                                       base::Allocator allocator) {
  if (device == Device::kCuda) return CreateCudaDeviceOps(allocator);
  return std::unique_ptr<DeviceOps>(new CpuDeviceOps(exec, allocator));
}

}  // namespace zero::runtime
