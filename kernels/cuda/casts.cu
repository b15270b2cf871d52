// Conversions and the element-wise sums on CUDA: grid-stride loops, one element per thread
// step (these run once per SetParam or per bucket, far from the step's bandwidth budget), but
// four for AddIntoFloat where aligned (it runs once per param gradient and micro-batch).
#include "base/status_converters.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/casts_cuda.h"
#include "kernels/cuda/elementwise.cuh"

namespace zero::kernels {
namespace cuda {
namespace {

template <typename T>
__global__ void WidenKernel(float* out, const void* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = Load(T{}, in, i);
  }
}

template <typename T>
__global__ void NarrowKernel(void* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    Store(T{}, out, i, in[i]);
  }
}

template <typename T>
__global__ void AddIntoKernel(void* accumulator, const void* addend, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    Store(T{}, accumulator, i, Load(T{}, accumulator, i) + Load(T{}, addend, i));
  }
}

// accumulator[i] += float(addend[i]) with an fp32 accumulator. With `vector`, both arrays
// allow four-element accesses and each thread step moves four elements (16 bytes of the
// accumulator); the last numel % 4 elements go one by one.
template <typename T>
__global__ void AddIntoFloatKernel(float* accumulator, const void* addend, int64_t n, bool vector) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  int64_t scalar_begin = 0;
  if (vector) {
    for (int64_t i = kVector * first; i + kVector <= n; i += kVector * stride) {
      float sum[kVector], add[kVector];
      Load4(F32{}, accumulator, i, sum);
      Load4(T{}, addend, i, add);
#pragma unroll
      for (int j = 0; j < kVector; ++j) sum[j] += add[j];
      Store4(F32{}, accumulator, i, sum);
    }
    scalar_begin = n / kVector * kVector;
  }
  for (int64_t i = scalar_begin + first; i < n; i += stride) accumulator[i] += Load(T{}, addend, i);
}

int GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 8192 ? blocks : 8192);
}

// Runs launch(tag) with the element tag of `dtype`, then checks the launch.
template <typename Launch>
Status WithTag(DType dtype, Launch launch) {
  switch (dtype) {
    case DType::kFP32: launch(F32{}); break;
    case DType::kBF16: launch(Bf16{}); break;
    case DType::kFP16: launch(Half{}); break;
    case DType::kInt64:
    case DType::kUInt8:
      return absl::InvalidArgumentError(absl::StrCat(DTypeName(dtype), " arrays: not a param dtype"));
  }
  ZERO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

Status CheckArguments(const char* kernel, const void* a, const void* b, int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(kernel, ": numel ", n, " is negative"));
  if (n > 0 && (a == nullptr || b == nullptr)) return absl::InvalidArgumentError(absl::StrCat(kernel, ": null pointer"));
  return absl::OkStatus();
}

}  // namespace
}  // namespace cuda

Status WidenToFloatCuda(float* out, const void* in, int64_t n, DType dtype, CudaStream stream) {
  ZERO_RETURN_IF_ERROR(cuda::CheckArguments("WidenToFloatCuda", out, in, n));
  if (n == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return cuda::WithTag(dtype, [&](auto tag) {
    cuda::WidenKernel<decltype(tag)><<<cuda::GridFor(n), cuda::kThreads, 0, s>>>(out, in, n);
  });
}

Status NarrowFromFloatCuda(void* out, const float* in, int64_t n, DType dtype, CudaStream stream) {
  ZERO_RETURN_IF_ERROR(cuda::CheckArguments("NarrowFromFloatCuda", out, in, n));
  if (n == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return cuda::WithTag(dtype, [&](auto tag) {
    cuda::NarrowKernel<decltype(tag)><<<cuda::GridFor(n), cuda::kThreads, 0, s>>>(out, in, n);
  });
}

Status AddIntoCuda(void* accumulator, const void* addend, int64_t n, DType dtype, CudaStream stream) {
  ZERO_RETURN_IF_ERROR(cuda::CheckArguments("AddIntoCuda", accumulator, addend, n));
  if (n == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return cuda::WithTag(dtype, [&](auto tag) {
    cuda::AddIntoKernel<decltype(tag)><<<cuda::GridFor(n), cuda::kThreads, 0, s>>>(accumulator, addend, n);
  });
}

Status AddIntoFloatCuda(float* accumulator, const void* addend, int64_t n, DType addend_dtype, CudaStream stream) {
  ZERO_RETURN_IF_ERROR(cuda::CheckArguments("AddIntoFloatCuda", accumulator, addend, n));
  if (n == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return cuda::WithTag(addend_dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool vector = n >= cuda::kVector && reinterpret_cast<uintptr_t>(accumulator) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(addend) % (cuda::kVector * cuda::Bytes(T{})) == 0;
    const int grid = cuda::GridFor(vector ? n / cuda::kVector : n);
    cuda::AddIntoFloatKernel<T><<<grid, cuda::kThreads, 0, s>>>(accumulator, addend, n, vector);
  });
}

}  // namespace zero::kernels
