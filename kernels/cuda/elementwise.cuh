// Multi-tensor apply for the CUDA optimizer kernels (internal to kernels/cuda): the launch table,
// element access by dtype, and the launcher that walks a segment list in launches of at most
// kSegmentsPerLaunch segments with one block per 64K-element chunk.
#ifndef ZERO_KERNELS_CUDA_ELEMENTWISE_CUH_
#define ZERO_KERNELS_CUDA_ELEMENTWISE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "absl/types/span.h"
#include "kernels/segments.h"
#include "kernels/type_dispatch.h"
#include "zero/status.h"

namespace zero::kernels::cuda {

constexpr int kSegmentsPerLaunch = 24;
constexpr int64_t kChunk = 65536;
constexpr int kThreads = 512;

/// What one launch covers: segments and, per segment, the first block's index.
struct Table {
  Segment segments[kSegmentsPerLaunch];
  int first_block[kSegmentsPerLaunch + 1];
  int count;
};

// Element access: fp32, bf16 and fp16 storage read as / written from float.
struct F32 {};
struct Bf16 {};
struct Half {};
struct NoCopy {};

__device__ inline float Load(F32, const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
__device__ inline float Load(Bf16, const void* p, int64_t i) { return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]); }
__device__ inline float Load(Half, const void* p, int64_t i) { return __half2float(static_cast<const __half*>(p)[i]); }
__device__ inline void Store(Bf16, void* p, int64_t i, float v) { static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); }
__device__ inline void Store(Half, void* p, int64_t i, float v) { static_cast<__half*>(p)[i] = __float2half_rn(v); }
__device__ inline void Store(NoCopy, void*, int64_t, float) {}

/// The segment and element range of this block.
__device__ inline const Segment& BlockSegment(const Table& t, int64_t* begin, int64_t* end) {
  int s = 0;
  while (s + 1 < t.count && static_cast<int>(blockIdx.x) >= t.first_block[s + 1]) ++s;
  *begin = (static_cast<int64_t>(blockIdx.x) - t.first_block[s]) * kChunk;
  *end = min(*begin + kChunk, t.segments[s].numel);
  return t.segments[s];
}

/// Calls launch(table, blocks) for consecutive groups of segments.
template <typename Launch>
Status ForEachLaunch(absl::Span<const Segment> segments, Launch launch) {
  Table table{};
  int blocks = 0;
  auto flush = [&]() -> Status {
    if (table.count == 0) return absl::OkStatus();
    table.first_block[table.count] = blocks;
    if (blocks > 0) launch(table, blocks);
    ZERO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    table = Table{};
    blocks = 0;
    return absl::OkStatus();
  };
  for (const Segment& s : segments) {
    if (s.numel == 0) continue;
    table.segments[table.count] = s;
    table.first_block[table.count] = blocks;
    blocks += static_cast<int>((s.numel + kChunk - 1) / kChunk);
    if (++table.count == kSegmentsPerLaunch) ZERO_RETURN_IF_ERROR(flush());
  }
  return flush();
}

/// The CUDA kernels' element-type tags, for kernels::DispatchTypes.
struct Tags {
  using F32 = cuda::F32;
  using Bf16 = cuda::Bf16;
  using Half = cuda::Half;
  using NoCopy = cuda::NoCopy;
};

/// Runs launch_one(param_tag, grad_tag, table, blocks) for every launch of `segments`, with the
/// tags of `types`: the body every launcher shares.
template <typename LaunchOne>
Status LaunchOverSegments(SegmentTypes types, absl::Span<const Segment> segments, LaunchOne launch_one) {
  Status status = absl::OkStatus();
  DispatchTypes<Tags>(types, [&](auto p, auto g) {
    status.Update(ForEachLaunch(segments, [&](const Table& t, int blocks) { launch_one(p, g, t, blocks); }));
  });
  return status;
}

}  // namespace zero::kernels::cuda

#endif  // ZERO_KERNELS_CUDA_ELEMENTWISE_CUH_
