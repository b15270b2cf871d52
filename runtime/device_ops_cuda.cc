// The "cuda" DeviceOps: CUDA device memory, the CUDA kernels, all work in order on the engine's
// stream. Calls that hand values to the host wait for that stream only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/status_converters.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/casts_cuda.h"
#include "kernels/cuda/optimizers_cuda.h"
#include "kernels/cuda/step_scalars_cuda.h"
#include "runtime/device_ops.h"

namespace zero::runtime {
namespace {

class CudaDeviceOps final : public DeviceOps {
 public:
  explicit CudaDeviceOps(base::Allocator allocator) : allocator_(allocator) {}

  Placement placement() const override { return Placement::kDevice; }
  Status SetStream(void* stream) override {
    ZERO_RETURN_IF_ERROR(Synchronize());  // work queued on the old stream stays ordered
    stream_ = static_cast<cudaStream_t>(stream);
    return absl::OkStatus();
  }
  void* stream() const override { return stream_; }
  Status Synchronize() override {
    ++host_waits_;
    ZERO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  bool asynchronous() const override { return true; }
  int64_t host_waits() const override { return host_waits_; }

  Status Zero(void* data, int64_t bytes) override {
    if (bytes > 0) ZERO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(data, 0, static_cast<size_t>(bytes), stream_));
    return absl::OkStatus();
  }
  Status Copy(void* destination, const void* source, int64_t bytes) override {
    if (bytes <= 0) return absl::OkStatus();
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(destination, source, static_cast<size_t>(bytes), cudaMemcpyDefault, stream_));
    return Synchronize();  // the source may be the trainer's pageable host memory
  }
  Status CopyOnDevice(void* destination, const void* source, int64_t bytes) override {
    if (bytes > 0) {
      ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(destination, source, static_cast<size_t>(bytes),
                                                cudaMemcpyDeviceToDevice, stream_));
    }
    return absl::OkStatus();
  }
  Status AddInto(void* accumulator, const void* addend, int64_t numel, DType dtype) override {
    return kernels::AddIntoCuda(accumulator, addend, numel, dtype, stream_);
  }
  Status AddIntoFloat(float* accumulator, const void* addend, int64_t numel, DType addend_dtype) override {
    return kernels::AddIntoFloatCuda(accumulator, addend, numel, addend_dtype, stream_);
  }
  Status Widen(float* out, const void* in, int64_t numel, DType dtype) override {
    return kernels::WidenToFloatCuda(out, in, numel, dtype, stream_);
  }
  Status Narrow(void* out, const float* in, int64_t numel, DType dtype) override {
    return kernels::NarrowFromFloatCuda(out, in, numel, dtype, stream_);
  }

  Status AdamStep(const kernels::AdamHyper& h, kernels::SegmentTypes types,
                  absl::Span<const kernels::Segment> segments) override {
    return kernels::AdamStepCuda(h, types, segments, stream_);
  }
  Status SgdStep(const kernels::SgdHyper& h, kernels::SegmentTypes types,
                 absl::Span<const kernels::Segment> segments) override {
    return kernels::SgdStepCuda(h, types, segments, stream_);
  }
  Status LionStep(const kernels::LionHyper& h, kernels::SegmentTypes types,
                  absl::Span<const kernels::Segment> segments) override {
    return kernels::LionStepCuda(h, types, segments, stream_);
  }
  Status LambUpdate(const kernels::LambHyper& h, kernels::SegmentTypes types,
                    absl::Span<const kernels::Segment> segments, absl::Span<float* const> updates) override {
    return kernels::LambUpdateCuda(h, types, segments, updates, stream_);
  }
  Status LambApply(const kernels::LambHyper& h, DType param_type, absl::Span<const kernels::Segment> segments,
                   absl::Span<const float* const> updates, absl::Span<const float> trust_ratios) override {
    return kernels::LambApplyCuda(h, param_type, segments, updates, trust_ratios, stream_);
  }

  // Partials in a device workspace; per-span sums, the total and the flag in one device block
  // copied to pinned host memory at once.
  Status SquaredNorms(absl::Span<const kernels::ConstSpan> spans, DType dtype, absl::Span<double> per_span,
                      kernels::NormResult* total) override {
    if (!per_span.empty() && per_span.size() != spans.size()) {
      return absl::InvalidArgumentError(absl::StrCat("SquaredNorms: ", per_span.size(), " outputs for ",
                                                     spans.size(), " spans"));
    }
    size_t bytes = 0;
    ZERO_RETURN_IF_ERROR(kernels::SquaredNormsCuda(nullptr, &bytes, spans, dtype, nullptr, nullptr, nullptr, stream_));
    ZERO_RETURN_IF_ERROR(Reserve(&workspace_, static_cast<int64_t>(bytes), Placement::kDevice));
    // Layout of the results: [total, flag (as a double slot), per-span sums...].
    const int64_t result_bytes = static_cast<int64_t>((2 + spans.size()) * sizeof(double));
    ZERO_RETURN_IF_ERROR(Reserve(&results_, result_bytes, Placement::kDevice));
    ZERO_RETURN_IF_ERROR(Reserve(&host_results_, result_bytes, Placement::kPinnedHost));
    double* device = results_.as<double>();
    bytes = static_cast<size_t>(workspace_.bytes());
    ZERO_RETURN_IF_ERROR(kernels::SquaredNormsCuda(workspace_.data(), &bytes, spans, dtype,
                                                   per_span.empty() ? nullptr : device + 2, device,
                                                   reinterpret_cast<int32_t*>(device + 1), stream_));
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_results_.data(), device, static_cast<size_t>(result_bytes),
                                              cudaMemcpyDeviceToHost, stream_));
    ZERO_RETURN_IF_ERROR(Synchronize());
    const double* host = host_results_.as<double>();
    int32_t flag = 0;
    std::memcpy(&flag, host + 1, sizeof flag);
    if (total != nullptr) *total = {host[0], flag != 0};
    for (size_t i = 0; i < per_span.size(); ++i) per_span[i] = host[2 + i];
    return absl::OkStatus();
  }

  // Each batch's total into its own device double (norm_totals_), then their sum, rounded once.
  Status SquaredNormOnDevice(absl::Span<const NormBatch> batches, float* sq_norm) override {
    size_t most = 0;
    for (const NormBatch& batch : batches) {
      size_t bytes = 0;
      ZERO_RETURN_IF_ERROR(kernels::SquaredNormsCuda(nullptr, &bytes, batch.spans, batch.dtype, nullptr, nullptr,
                                                     nullptr, stream_));
      most = std::max(most, bytes);
    }
    ZERO_RETURN_IF_ERROR(Reserve(&workspace_, static_cast<int64_t>(most), Placement::kDevice));
    ZERO_RETURN_IF_ERROR(Reserve(&norm_totals_, static_cast<int64_t>(std::max<size_t>(batches.size(), 1) * sizeof(double)),
                                 Placement::kDevice));
    double* totals = norm_totals_.as<double>();
    for (size_t k = 0; k < batches.size(); ++k) {  // in stream order: one workspace serves all
      size_t bytes = static_cast<size_t>(workspace_.bytes());
      ZERO_RETURN_IF_ERROR(kernels::SquaredNormsCuda(workspace_.data(), &bytes, batches[k].spans, batches[k].dtype,
                                                     nullptr, totals + k, nullptr, stream_));
    }
    return kernels::SumToFloatCuda(totals, static_cast<int>(batches.size()), sq_norm, stream_);
  }
  bool squares_in_step() const override { return true; }
  Status SumPartials(const double* partials, int64_t count, float* out) override {
    return kernels::SumPartialsCuda(partials, count, out, stream_);
  }
  Status DecideClip(const float* sq_norm, double divisor, float max_norm, float* grad_norm,
                    float* grad_scale) override {
    return kernels::DecideClipCuda(sq_norm, divisor, max_norm, grad_norm, grad_scale, stream_);
  }

 private:
  // Grows `buffer` to at least `bytes` (it is scratch: old contents are dropped).
  Status Reserve(base::Buffer* buffer, int64_t bytes, Placement placement) {
    if (buffer->bytes() >= bytes) return absl::OkStatus();
    ZERO_RETURN_IF_ERROR(Synchronize());  // queued kernels may still use the old scratch
    buffer->Reset();
    ZERO_ASSIGN_OR_RETURN(*buffer, allocator_.Allocate(bytes, MemoryCategory::kWorkspace, placement));
    return absl::OkStatus();
  }

  base::Allocator allocator_;
  cudaStream_t stream_ = nullptr;
  int64_t host_waits_ = 0;
  base::Buffer workspace_, results_, host_results_, norm_totals_;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceOps>> CreateCudaDeviceOps(base::Allocator allocator) {
  if (CudaDeviceCount() == 0) {
    return absl::UnavailableError(
        "device \"cuda\": no CUDA device is visible to this process (check the driver and "
        "CUDA_VISIBLE_DEVICES), so the engine cannot run there; use \"device\": \"cpu\"");
  }
  return std::unique_ptr<DeviceOps>(new CudaDeviceOps(allocator));
}

}  // namespace zero::runtime
