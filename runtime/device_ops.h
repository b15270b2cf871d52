// What the engine does to the contents of its buffers, on the engine's device (internal to
// runtime). The stage policies (GradStore, OptimizerState, the stage-3 units, checkpoints) are
// written once against this interface:
//
//   cpu   host memory; the vectorised CPU kernels; every call completes before it returns
//   cuda  CUDA device memory; the CUDA kernels, all queued in order on the engine's stream
//         (the trainer's, from Engine::SetStream, or the legacy default stream); calls that
//         hand values to the host (Copy, SquaredNorms) wait for that stream, never the device
//
// Values the engine needs on the device only (the step's norm and clip coefficient) stay
// there: SquaredNormOnDevice and DecideClip write device memory, which the optimizer kernels
// read (StepCommon::grad_scale_at), so a step needs no wait by the host.
//
// Every buffer the engine owns comes from the accounting allocator in placement().
#ifndef ZERO_RUNTIME_DEVICE_OPS_H_
#define ZERO_RUNTIME_DEVICE_OPS_H_

#include <memory>

#include "absl/types/span.h"
#include "kernels/cpu/cpu_exec.h"
#include "kernels/segments.h"
#include "base/allocator.h"
#include "zero/device.h"
#include "zero/status.h"

namespace zero::runtime {

/// Gradient spans of one dtype, for a norm over several dtypes.
struct NormBatch {
  absl::Span<const kernels::ConstSpan> spans;
  DType dtype = DType::kFP32;
};

class DeviceOps {
 public:
  /// The operations of `device`. kUnavailable for "cuda" in a build without CUDA or on a
  /// machine without a visible GPU (the message says which).
  static StatusOr<std::unique_ptr<DeviceOps>> Create(Device device, const kernels::CpuExec& exec,
                                                     base::Allocator allocator);
  virtual ~DeviceOps() = default;

  /// Where the engine's buffers live on this device.
  virtual Placement placement() const = 0;
  /// The cudaStream_t later work is queued on (cuda); kInvalidArgument for a non-null stream
  /// on the CPU.
  virtual Status SetStream(void* stream) = 0;
  /// The stream work is queued on (a cudaStream_t; null on the CPU and for the legacy default
  /// stream).
  virtual void* stream() const = 0;
  /// Waits until the work queued so far is done (a no-op on the CPU).
  virtual Status Synchronize() = 0;
  /// True when calls queue work that runs later (cuda): a value the ops write is on the host
  /// only after a Copy. False when every call completes before it returns (cpu).
  virtual bool asynchronous() const = 0;
  /// How many times a call so far made the host wait for the device (Synchronize, and the
  /// calls that hand values to the host); 0 on the CPU.
  virtual int64_t host_waits() const = 0;

  /// Sets `bytes` bytes at `data` to zero.
  virtual Status Zero(void* data, int64_t bytes) = 0;
  /// Copies `bytes` between any two placements (the trainer's host or device pointers and the
  /// engine's buffers); the destination holds the values when the call returns.
  virtual Status Copy(void* destination, const void* source, int64_t bytes) = 0;
  /// Copies `bytes` between two buffers on this device, queued in order with the other
  /// operations (the host does not wait for it).
  virtual Status CopyOnDevice(void* destination, const void* source, int64_t bytes) = 0;
  /// accumulator[i] = round(accumulator[i] + addend[i]) in `dtype`, summed in fp32.
  virtual Status AddInto(void* accumulator, const void* addend, int64_t numel, DType dtype) = 0;
  /// accumulator[i] += float(addend[i]): an fp32 gradient and a gradient in `addend_dtype`
  /// (fp32, bf16 or fp16), widened on the way, summed in fp32. The arrays do not overlap.
  virtual Status AddIntoFloat(float* accumulator, const void* addend, int64_t numel, DType addend_dtype) = 0;
  /// out[i] = float(in[i]) for bf16/fp16/fp32 `in`.
  virtual Status Widen(float* out, const void* in, int64_t numel, DType dtype) = 0;
  /// out[i] = in[i] rounded to `dtype` (nearest even).
  virtual Status Narrow(void* out, const float* in, int64_t numel, DType dtype) = 0;

  /// The fused optimizer passes of kernels/segments.h over device-resident segments.
  virtual Status AdamStep(const kernels::AdamHyper& hyper, kernels::SegmentTypes types,
                          absl::Span<const kernels::Segment> segments) = 0;
  virtual Status SgdStep(const kernels::SgdHyper& hyper, kernels::SegmentTypes types,
                         absl::Span<const kernels::Segment> segments) = 0;
  virtual Status LionStep(const kernels::LionHyper& hyper, kernels::SegmentTypes types,
                          absl::Span<const kernels::Segment> segments) = 0;
  virtual Status LambUpdate(const kernels::LambHyper& hyper, kernels::SegmentTypes types,
                            absl::Span<const kernels::Segment> segments,
                            absl::Span<float* const> updates) = 0;
  /// LAMB's second pass; `trust_ratios` are host values, one per segment.
  virtual Status LambApply(const kernels::LambHyper& hyper, DType param_type,
                           absl::Span<const kernels::Segment> segments,
                           absl::Span<const float* const> updates,
                           absl::Span<const float> trust_ratios) = 0;
  /// Deterministic sums of squares of `spans`, delivered to the host: each span's into
  /// `per_span` (empty, or one per span) and all of them, with the Inf/NaN flag, into `*total`.
  /// Scratch memory comes from the allocator (category workspace) and is kept for later calls.
  virtual Status SquaredNorms(absl::Span<const kernels::ConstSpan> spans, DType dtype,
                              absl::Span<double> per_span, kernels::NormResult* total) = 0;
  /// The sum of squares of every batch's spans, each batch summed as SquaredNorms does, the
  /// batches in float64 in order, rounded once into `*sq_norm` (memory of this device; not
  /// finite when an element is Inf/NaN). Left where it is: the host does not wait.
  virtual Status SquaredNormOnDevice(absl::Span<const NormBatch> batches, float* sq_norm) = 0;
  /// Whether the optimizer passes above sum the squares of the gradients they read as they
  /// step (kernels::StepCommon::grad_squares; cuda), so a norm nothing waits for costs no read
  /// of its own. False on the CPU, whose loops take it in a pass before the step.
  virtual bool squares_in_step() const { return false; }
  /// The `count` float64 partials a step's grad_squares received, summed in a fixed order and
  /// rounded once into `*out` (memory of this device); the host does not wait. kUnimplemented
  /// where squares_in_step() is false.
  virtual Status SumPartials(const double* partials, int64_t count, float* out);
  /// kernels::DecideClip(*sq_norm, divisor, max_norm) into *grad_norm and *grad_scale, taken
  /// on this device (all three pointers are its memory); the host does not wait.
  virtual Status DecideClip(const float* sq_norm, double divisor, float max_norm, float* grad_norm,
                            float* grad_scale) = 0;
};

/// The "cuda" operations (device_ops_cuda.cc); kUnavailable in a build without CUDA or on a
/// machine without a GPU. DeviceOps::Create calls it.
StatusOr<std::unique_ptr<DeviceOps>> CreateCudaDeviceOps(base::Allocator allocator);

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_DEVICE_OPS_H_
