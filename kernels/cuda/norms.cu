// Deterministic squared norms on CUDA: each block writes the float64 sum of squares of its
// chunk (cub::BlockReduce: warp shuffles in a fixed pattern, no atomics) into the workspace; then one block per span sums
// that span's partials in order (per-span norms, LAMB's trust ratios), and one block sums all
// partials in order and sets the Inf/NaN flag. Same inputs, same bits, run to run.
#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <vector>

#include "base/status_converters.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/optimizers_cuda.h"

namespace zero::kernels {
namespace cuda {
namespace {

// Sums a double over the block in a fixed order; the total is valid in thread 0.
using BlockSum = cub::BlockReduce<double, kThreads>;

// One partial per block: the chunk's sum of squares (the span's data travels as Segment::grad).
template <typename G>
__global__ void __launch_bounds__(kThreads) SquaresKernel(LaunchTable t, double* partials) {
  __shared__ BlockSum::TempStorage shared;
  int64_t begin, end;
  int k;
  const Segment& s = BlockSegment(t, &begin, &end, &k);
  double sum = 0.0;
  if (VectorAligned(s.grad, Bytes(G{}))) {
    for (int64_t i = begin + kVector * static_cast<int64_t>(threadIdx.x); i < end; i += kVector * int64_t{blockDim.x}) {
      if (i + kVector <= end) {
        float x[4];
        Load4(G{}, s.grad, i, x);
#pragma unroll
        for (int j = 0; j < kVector; ++j) sum = fma(double(x[j]), double(x[j]), sum);
      } else {
        for (int64_t j = i; j < end; ++j) {
          const double x = Load(G{}, s.grad, j);
          sum = fma(x, x, sum);
        }
      }
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const double x = Load(G{}, s.grad, i);
      sum = fma(x, x, sum);
    }
  }
  const double total = BlockSum(shared).Sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Block k sums the partials of the table's k-th segment, in order, into per_span[index].
__global__ void __launch_bounds__(kThreads) SpanSumsKernel(LaunchTable t, const double* partials, double* per_span) {
  __shared__ BlockSum::TempStorage shared;
  const int k = blockIdx.x;
  double sum = 0.0;
  for (int i = t.first_block[k] + threadIdx.x; i < t.first_block[k + 1]; i += blockDim.x) sum += partials[i];
  const double all = BlockSum(shared).Sum(sum);
  if (threadIdx.x == 0) per_span[t.index[k]] = all;
}

__global__ void __launch_bounds__(kThreads) FinishKernel(const double* partials, int count, double* total, int32_t* nonfinite) {
  __shared__ BlockSum::TempStorage shared;
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];  // fixed assignment
  const double all = BlockSum(shared).Sum(sum);
  if (threadIdx.x == 0) {
    if (total != nullptr) *total = all;
    if (nonfinite != nullptr) *nonfinite = isfinite(all) ? 0 : 1;
  }
}

// One block: the partials summed in a fixed order, rounded once to float.
__global__ void __launch_bounds__(kThreads) SumPartialsKernel(const double* partials, int64_t count, float* out) {
  __shared__ BlockSum::TempStorage shared;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];  // fixed assignment
  const double all = BlockSum(shared).Sum(sum);
  if (threadIdx.x == 0) *out = static_cast<float>(all);
}

}  // namespace
}  // namespace cuda

Status SumPartialsCuda(const double* partials, int64_t count, float* out, CudaStream stream) {
  if (out == nullptr || count < 0 || (count > 0 && partials == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("SumPartialsCuda: ", count, " partials, null pointers"));
  }
  cuda::SumPartialsKernel<<<1, cuda::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(partials, count, out);
  ZERO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

Status SquaredNormsCuda(void* workspace, size_t* workspace_bytes, absl::Span<const ConstSpan> spans, DType dtype,
                        double* per_span, double* total, int32_t* nonfinite, CudaStream stream) {
  constexpr const char* kName = "SquaredNormsCuda";
  if (workspace_bytes == nullptr) return absl::InvalidArgumentError(absl::StrCat(kName, ": workspace_bytes is null"));
  std::vector<Segment> segments;
  int64_t chunks = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const ConstSpan& span = spans[i];
    if (span.numel < 0 || (span.numel > 0 && span.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(kName, ": span ", i, " has a negative size or null data"));
    }
    Segment s;
    s.grad = span.data;
    s.numel = span.numel;
    segments.push_back(s);
    chunks += (span.numel + kChunkElems - 1) / kChunkElems;
  }
  const size_t needed = static_cast<size_t>(std::max<int64_t>(chunks, 1)) * sizeof(double);
  if (workspace == nullptr) {
    *workspace_bytes = needed;
    return absl::OkStatus();
  }
  if (*workspace_bytes < needed) {
    return absl::InvalidArgumentError(absl::StrCat(kName, ": workspace of ", *workspace_bytes, " bytes, ", needed, " needed"));
  }
  if (total == nullptr && nonfinite == nullptr && per_span == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kName, ": no output (per_span, total and nonfinite are all null)"));
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  double* partials = static_cast<double*>(workspace);
  if (per_span != nullptr && !spans.empty()) {  // empty spans launch nothing: their sum is 0
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(per_span, 0, spans.size() * sizeof(double), s));
  }
  int first = 0;
  Status status = absl::OkStatus();
  auto launch = [&](auto tag) {
    status.Update(cuda::ForEachLaunch(segments, {}, {}, [&](const LaunchTable& t, int blocks) {
      cuda::SquaresKernel<decltype(tag)><<<blocks, cuda::kThreads, 0, s>>>(t, partials + first);
      if (per_span != nullptr) cuda::SpanSumsKernel<<<t.count, cuda::kThreads, 0, s>>>(t, partials + first, per_span);
      first += blocks;
    }));
  };
  switch (dtype) {
    case DType::kFP32: launch(cuda::F32{}); break;
    case DType::kBF16: launch(cuda::Bf16{}); break;
    case DType::kFP16: launch(cuda::Half{}); break;
    case DType::kInt64:
    case DType::kUInt8:
      return absl::InvalidArgumentError(absl::StrCat("norms of ", DTypeName(dtype), " arrays: not a param dtype"));
  }
  ZERO_RETURN_IF_ERROR(status);
  if (total == nullptr && nonfinite == nullptr) return absl::OkStatus();
  if (chunks == 0) ZERO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(partials, 0, sizeof(double), s));
  cuda::FinishKernel<<<1, cuda::kThreads, 0, s>>>(partials, static_cast<int>(std::max<int64_t>(chunks, 1)), total, nonfinite);
  ZERO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace zero::kernels
