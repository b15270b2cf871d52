// CPU squared-norm launcher: chunk partials from the ISA loop, summed in a fixed order.
#include "kernels/cpu/norms.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/isa/dispatch.h"
#include "kernels/launch_checks.h"

namespace zero::kernels {

Status SquaredNormsCpu(void* workspace, size_t* workspace_bytes,
                       absl::Span<const ConstSpan> spans, DType dtype,
                       absl::Span<double> per_span, NormResult* total, const CpuExec& exec) {
  if (workspace_bytes == nullptr) {
    return absl::InvalidArgumentError("SquaredNormsCpu: workspace_bytes is null");
  }
  int64_t chunks = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].numel < 0 || (spans[i].numel > 0 && spans[i].data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("SquaredNormsCpu: span ", i, " has numel ",
                                                     spans[i].numel,
                                                     spans[i].data == nullptr ? " and null data"
                                                                              : ""));
    }
    chunks += (spans[i].numel + cpu::kChunkElems - 1) / cpu::kChunkElems;
  }
  const size_t needed = static_cast<size_t>(chunks) * sizeof(double);
  if (workspace == nullptr) {
    *workspace_bytes = needed;
    return absl::OkStatus();
  }
  if (*workspace_bytes < needed) {
    return absl::InvalidArgumentError(absl::StrCat("SquaredNormsCpu: workspace of ",
                                                   *workspace_bytes, " bytes, ", needed,
                                                   " needed"));
  }
  if (total == nullptr) return absl::InvalidArgumentError("SquaredNormsCpu: total is null");
  if (!per_span.empty() && per_span.size() != spans.size()) {
    return absl::InvalidArgumentError(absl::StrCat("SquaredNormsCpu: per_span has ",
                                                   per_span.size(), " entries for ",
                                                   spans.size(), " spans"));
  }
  ZERO_RETURN_IF_ERROR(CheckExec(exec));

  double* partials = static_cast<double*>(workspace);
  ZERO_ISA_DISPATCH(exec.isa, SquaresLoop, dtype, spans.data(),
                    static_cast<int64_t>(spans.size()), partials, exec.threads);
  *total = NormResult{};
  int64_t chunk = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    double span_sum = 0.0;
    const int64_t span_chunks = (spans[i].numel + cpu::kChunkElems - 1) / cpu::kChunkElems;
    for (int64_t c = 0; c < span_chunks; ++c) span_sum += partials[chunk++];
    if (!per_span.empty()) per_span[i] = span_sum;
    total->sq_norm += span_sum;
  }
  total->nonfinite = !std::isfinite(total->sq_norm);
  return absl::OkStatus();
}

}  // namespace zero::kernels
