// The local backend's collectives on CUDA device buffers: a reduction kernel over the ranks'
// inputs (fp32 accumulation in rank order, one rounding) and device-to-device copies.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "base/status_converters.h"
#include "comm/local/arrival.h"
#include "kernels/cuda/elementwise.cuh"

namespace zero::comm {
namespace {

constexpr int kMaxRanks = 64;  // the input pointers travel by value in the kernel arguments

struct Inputs {
  const void* pointers[kMaxRanks];
};

// out[i] = op over k (in order) of inputs[k][i]; `out` may alias an input at the same index.
// (Element access by dtype tag: kernels/cuda/elementwise.cuh, as the optimizer kernels.)
template <typename Tag, bool kMax>
__global__ void ReduceKernel(void* out, Inputs inputs, int count_inputs, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    float acc = kernels::cuda::Load(Tag{}, inputs.pointers[0], i);
    for (int k = 1; k < count_inputs; ++k) {
      const float x = kernels::cuda::Load(Tag{}, inputs.pointers[k], i);
      acc = kMax ? fmaxf(acc, x) : acc + x;
    }
    kernels::cuda::Store(Tag{}, out, i, acc);
  }
}

template <typename Tag>
void LaunchReduce(void* out, const Inputs& inputs, int n, int64_t count, ReduceOp op) {
  const int threads = 256;
  const int blocks = static_cast<int>((count + threads - 1) / threads < 4096 ? (count + threads - 1) / threads : 4096);
  if (count == 0) return;
  if (op == ReduceOp::kMax) {
    ReduceKernel<Tag, true><<<blocks, threads>>>(out, inputs, n, count);
  } else {
    ReduceKernel<Tag, false><<<blocks, threads>>>(out, inputs, n, count);
  }
}

Status Reduce(void* out, const Inputs& inputs, int n, int64_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFP32: LaunchReduce<kernels::cuda::F32>(out, inputs, n, count, op); break;
    case DType::kBF16: LaunchReduce<kernels::cuda::Bf16>(out, inputs, n, count, op); break;
    case DType::kFP16: LaunchReduce<kernels::cuda::Half>(out, inputs, n, count, op); break;
    case DType::kInt64:
    case DType::kUInt8:
      return absl::UnimplementedError(absl::StrCat(
          "the local communicator does not reduce ", DTypeName(dtype),
          " CUDA buffers (all-gather and broadcast of them work; reduce host buffers instead)"));
  }
  ZERO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

Status ExecuteOnDevice(const Arrivals& arrivals) {
  const int size = static_cast<int>(arrivals.size());
  if (size > kMaxRanks) {
    return absl::UnimplementedError("the local communicator supports at most 64 ranks on CUDA buffers");
  }
  const CollectiveSignature& s = arrivals[0]->signature;
  const size_t element = DTypeSize(s.dtype);
  const size_t chunk_bytes = static_cast<size_t>(s.count) * element;
  Inputs inputs{};
  switch (s.kind) {
    case CollectiveKind::kReduceScatter:
      for (int r = 0; r < size; ++r) {
        for (int k = 0; k < size; ++k) inputs.pointers[k] = static_cast<const char*>(arrivals[k]->send) + r * chunk_bytes;
        ZERO_RETURN_IF_ERROR(Reduce(arrivals[r]->recv, inputs, size, s.count, s.dtype, s.op));
      }
      break;
    case CollectiveKind::kAllReduce:
      for (int k = 0; k < size; ++k) inputs.pointers[k] = arrivals[k]->send;
      ZERO_RETURN_IF_ERROR(Reduce(arrivals[0]->recv, inputs, size, s.count, s.dtype, s.op));
      for (int r = 1; r < size; ++r) {
        if (arrivals[r]->recv != arrivals[0]->recv) {
          ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpy(arrivals[r]->recv, arrivals[0]->recv, chunk_bytes, cudaMemcpyDefault));
        }
      }
      break;
    case CollectiveKind::kAllGather:
      for (int q = 0; q < size; ++q) {
        for (int i = 0; i < size; ++i) {
          char* destination = static_cast<char*>(arrivals[q]->recv) + i * chunk_bytes;
          if (destination != arrivals[i]->send) {
            ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpy(destination, arrivals[i]->send, chunk_bytes, cudaMemcpyDefault));
          }
        }
      }
      break;
    case CollectiveKind::kBroadcast:
      for (int r = 0; r < size; ++r) {
        if (r != s.root && arrivals[r]->recv != arrivals[s.root]->send) {
          ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpy(arrivals[r]->recv, arrivals[s.root]->send, chunk_bytes, cudaMemcpyDefault));
        }
      }
      break;
    case CollectiveKind::kBarrier:
      break;
  }
  ZERO_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));  // the legacy stream: kernels and copies above
  return absl::OkStatus();
}

}  // namespace zero::comm
