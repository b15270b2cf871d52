// Fused optimizer steps and squared norms on CUDA device memory: the CUDA counterparts of
// kernels/cpu/optimizers.h and norms.h, with the same math and the stream last.
//
// Multi-tensor apply: segments are cut into 8K-element chunks; one launch covers up to
// kSegmentsPerLaunch segments (their pointers travel in the kernel arguments, well within the
// 4 KB limit) and one block per chunk; longer lists take several launches. Chunks whose arrays
// are 16-byte aligned (8-byte for bf16/fp16) move four elements per load and store. The overflow flag
// (StepCommon::skip, a device pointer here) is read by the kernels, so skipping needs no host
// round trip. Nothing is allocated inside a launcher: norms use a CUB-style two-phase
// workspace.
#ifndef ZERO_KERNELS_CUDA_OPTIMIZERS_CUDA_H_
#define ZERO_KERNELS_CUDA_OPTIMIZERS_CUDA_H_

#include <cstddef>

#include "absl/types/span.h"
#include "kernels/segments.h"
#include "zero/status.h"

namespace zero::kernels {

/// A cudaStream_t, kept opaque so that this header needs no CUDA headers.
using CudaStream = void*;

/// Adam / AdamW on device segments (pointers in device memory). `hyper.common.skip` may point to
/// a device int32 flag: when non-zero the kernels modify nothing; `hyper.common.grad_scale_at`
/// to a device float the kernels read the gradient scale from; `hyper.common.grad_squares` to
/// LaunchBlocks(segments) device doubles the step writes its gradients' squared sums into (as
/// every launcher below but LambApplyCuda, which reads no gradient).
Status AdamStepCuda(const AdamHyper& hyper, SegmentTypes types, absl::Span<const Segment> segments,
                    CudaStream stream);
/// SGD with momentum/dampening/Nesterov on device segments.
Status SgdStepCuda(const SgdHyper& hyper, SegmentTypes types, absl::Span<const Segment> segments,
                   CudaStream stream);
/// Lion on device segments.
Status LionStepCuda(const LionHyper& hyper, SegmentTypes types, absl::Span<const Segment> segments,
                    CudaStream stream);
/// LAMB, first pass on device segments: the moments and the update direction into
/// `updates[i]` (device buffers of segments[i].numel floats), as LambUpdateCpu.
Status LambUpdateCuda(const LambHyper& hyper, SegmentTypes types, absl::Span<const Segment> segments,
                      absl::Span<float* const> updates, CudaStream stream);
/// LAMB, second pass: p -= lr · trust_ratios[i] · updates[i], as LambApplyCpu. The ratios are
/// host values and travel in the launch arguments.
Status LambApplyCuda(const LambHyper& hyper, DType param_type, absl::Span<const Segment> segments,
                     absl::Span<const float* const> updates, absl::Span<const float> trust_ratios,
                     CudaStream stream);

/// Sums `count` float64 partials (StepCommon::grad_squares) in a fixed order and rounds the
/// total once into `*out` (device pointers): the squared gradient norm of a step that summed
/// its squares as it ran. The host does not wait.
Status SumPartialsCuda(const double* partials, int64_t count, float* out, CudaStream stream);

/// Sums of squares (float64) of device `spans`: each span's own into per_span[i] (a device
/// array of spans.size() doubles, or null), all of them into `*total`, and an Inf/NaN flag into
/// `*nonfinite` (device pointers; either may be null). Deterministic: fixed chunk partials,
/// then passes that sum them in order. Call with `workspace == nullptr` first to learn the
/// bytes needed.
Status SquaredNormsCuda(void* workspace, size_t* workspace_bytes, absl::Span<const ConstSpan> spans,
                        DType dtype, double* per_span, double* total, int32_t* nonfinite,
                        CudaStream stream);

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_CUDA_OPTIMIZERS_CUDA_H_
