// Fused optimizer steps and squared norms on CUDA device memory: the CUDA counterparts of
// kernels/cpu/optimizers.h and norms.h, with the same math and the stream last.
//
// Multi-tensor apply: segments are cut into 64K-element chunks; one launch covers up to
// kSegmentsPerLaunch segments (their pointers travel in the kernel arguments, well within the
// 4 KB limit) and one block per chunk; longer lists take several launches. The overflow flag
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
/// a device int32 flag: when non-zero the kernels modify nothing.
Status AdamStepCuda(const AdamHyper& hyper, SegmentTypes types, absl::Span<const Segment> segments,
                    CudaStream stream);
/// SGD with momentum/dampening/Nesterov on device segments.
Status SgdStepCuda(const SgdHyper& hyper, SegmentTypes types, absl::Span<const Segment> segments,
                   CudaStream stream);
/// Lion on device segments.
Status LionStepCuda(const LionHyper& hyper, SegmentTypes types, absl::Span<const Segment> segments,
                    CudaStream stream);

/// Sum of squares (float64) of every element of `spans` and an Inf/NaN flag, written to the
/// device pointers `total` and `nonfinite`; deterministic (fixed chunk partials, then one pass
/// that sums them in order). Call with `workspace == nullptr` first to learn the bytes needed.
Status SquaredNormCuda(void* workspace, size_t* workspace_bytes, absl::Span<const ConstSpan> spans, DType dtype,
                       double* total, int32_t* nonfinite, CudaStream stream);

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_CUDA_OPTIMIZERS_CUDA_H_
