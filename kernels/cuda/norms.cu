// Deterministic squared norms on CUDA: each block writes the float64 sum of squares of its
// chunk (a fixed-order shared-memory tree) into the workspace; one block then sums the partials
// in order and sets the Inf/NaN flag. Same inputs, same bits, run to run.
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/optimizers_cuda.h"

#include "absl/strings/str_cat.h"

namespace zero::kernels {
namespace cuda {
namespace {

// Sums `value` over the block in a fixed tree; thread 0 gets the total.
__device__ double BlockSum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

template <typename G>
__global__ void SquaresKernel(Table t, double* partials, int first_partial) {
  __shared__ double shared[kThreads];
  int64_t begin, end;
  const Segment& s = BlockSegment(t, &begin, &end);
  double sum = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double x = Load(G{}, s.grad, i);
    sum = fma(x, x, sum);
  }
  const double total = BlockSum(sum, shared);
  if (threadIdx.x == 0) partials[first_partial + blockIdx.x] = total;
}

__global__ void FinishKernel(const double* partials, int count, double* total, int32_t* nonfinite) {
  __shared__ double shared[kThreads];
  double sum = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];  // fixed assignment
  const double all = BlockSum(sum, shared);
  if (threadIdx.x == 0) {
    *total = all;
    *nonfinite = isfinite(all) ? 0 : 1;
  }
}

}  // namespace
}  // namespace cuda

Status SquaredNormCuda(void* workspace, size_t* workspace_bytes, absl::Span<const ConstSpan> spans, DType dtype,
                       double* total, int32_t* nonfinite, CudaStream stream) {
  if (workspace_bytes == nullptr) return absl::InvalidArgumentError("SquaredNormCuda: workspace_bytes is null");
  std::vector<Segment> segments;
  int64_t chunks = 0;
  for (const ConstSpan& span : spans) {
    if (span.numel < 0 || (span.numel > 0 && span.data == nullptr)) {
      return absl::InvalidArgumentError("SquaredNormCuda: a span has a negative size or null data");
    }
    Segment s;
    s.grad = span.data;
    s.numel = span.numel;
    segments.push_back(s);
    chunks += (span.numel + cuda::kChunk - 1) / cuda::kChunk;
  }
  const size_t needed = static_cast<size_t>(std::max<int64_t>(chunks, 1)) * sizeof(double);
  if (workspace == nullptr) {
    *workspace_bytes = needed;
    return absl::OkStatus();
  }
  if (*workspace_bytes < needed) {
    return absl::InvalidArgumentError(absl::StrCat("SquaredNormCuda: workspace of ", *workspace_bytes, " bytes, ", needed, " needed"));
  }
  if (total == nullptr || nonfinite == nullptr) return absl::InvalidArgumentError("SquaredNormCuda: null output");
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  double* partials = static_cast<double*>(workspace);
  int first = 0;
  Status status = absl::OkStatus();
  auto launch = [&](auto tag) {
    status.Update(cuda::ForEachLaunch(segments, [&](const cuda::Table& t, int blocks) {
      cuda::SquaresKernel<decltype(tag)><<<blocks, cuda::kThreads, 0, s>>>(t, partials, first);
      first += blocks;
    }));
  };
  switch (dtype) {
    case DType::kFP32: launch(cuda::F32{}); break;
    case DType::kBF16: launch(cuda::Bf16{}); break;
    case DType::kFP16: launch(cuda::Half{}); break;
  }
  ZERO_RETURN_IF_ERROR(status);
  if (chunks == 0) ZERO_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(partials, 0, sizeof(double), s));
  cuda::FinishKernel<<<1, cuda::kThreads, 0, s>>>(partials, static_cast<int>(std::max<int64_t>(chunks, 1)), total, nonfinite);
  ZERO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace zero::kernels
