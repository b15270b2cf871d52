// Deterministic squared L2 norms over span lists, with Inf/NaN detection, on the CPU.
//
// Two-phase, as CUB: call once with `workspace == nullptr` to learn `*workspace_bytes`, then
// again with that much scratch. Every span is cut into fixed chunks whose float64 partials are
// summed in order, so the same inputs give the same bits for any thread count.
#ifndef ZERO_KERNELS_CPU_NORMS_H_
#define ZERO_KERNELS_CPU_NORMS_H_

#include <cstddef>

#include "absl/types/span.h"
#include "kernels/cpu/cpu_exec.h"
#include "kernels/segments.h"
#include "zero/status.h"

namespace zero::kernels {

/// Sum of squares of all elements of `spans` (dtype `dtype`), in float64.
/// `per_span`, when not empty, receives each span's own sum (same length as `spans`).
/// `total->nonfinite` is set when any element is Inf or NaN: the overflow check of a
/// loss-scaled step and the norm for clipping come from this one read-only pass.
Status SquaredNormsCpu(void* workspace, size_t* workspace_bytes, absl::Span<const ConstSpan> spans,
                       DType dtype, absl::Span<double> per_span, NormResult* total,
                       const CpuExec& exec);

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_CPU_NORMS_H_
