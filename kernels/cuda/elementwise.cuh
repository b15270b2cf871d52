// Multi-tensor apply for the CUDA optimizer kernels (internal to kernels/cuda): element access
// by dtype (one element, or four through one 16-byte / 8-byte load), the element-wise driver
// every optimizer kernel shares, and the launcher over the host-built launch tables
// (kernels/launch_table.h: at most kSegmentsPerLaunch segments, one block per 8K elements).
#ifndef ZERO_KERNELS_CUDA_ELEMENTWISE_CUH_
#define ZERO_KERNELS_CUDA_ELEMENTWISE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status_converters.h"
#include "absl/types/span.h"
#include "kernels/launch_table.h"
#include "kernels/segments.h"
#include "kernels/type_dispatch.h"
#include "zero/status.h"

namespace zero::kernels::cuda {

constexpr int kThreads = 512;
constexpr int kVector = 4;  // elements per vector access: 16 bytes of fp32, 8 of bf16/fp16

// Element access: fp32, bf16 and fp16 storage read as / written from float.
struct F32 {};
struct Bf16 {};
struct Half {};
struct NoCopy {};

__device__ inline float Load(F32, const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
__device__ inline float Load(Bf16, const void* p, int64_t i) { return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]); }
__device__ inline float Load(Half, const void* p, int64_t i) { return __half2float(static_cast<const __half*>(p)[i]); }
__device__ inline void Store(F32, void* p, int64_t i, float v) { static_cast<float*>(p)[i] = v; }
__device__ inline void Store(Bf16, void* p, int64_t i, float v) { static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); }
__device__ inline void Store(Half, void* p, int64_t i, float v) { static_cast<__half*>(p)[i] = __float2half_rn(v); }
__device__ inline void Store(NoCopy, void*, int64_t, float) {}

// Four consecutive elements at element i (a multiple of 4) with one vector access.
__device__ inline void Load4(F32, const void* p, int64_t i, float out[4]) {
  const float4 v = reinterpret_cast<const float4*>(p)[i / 4];
  out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
}
__device__ inline void Load4(Bf16, const void* p, int64_t i, float out[4]) {
  const uint2 raw = reinterpret_cast<const uint2*>(p)[i / 4];
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
}
__device__ inline void Load4(Half, const void* p, int64_t i, float out[4]) {
  const uint2 raw = reinterpret_cast<const uint2*>(p)[i / 4];
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
  out[0] = a.x; out[1] = a.y; out[2] = b.x; out[3] = b.y;
}
__device__ inline void Store4(F32, void* p, int64_t i, const float v[4]) {
  reinterpret_cast<float4*>(p)[i / 4] = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ inline void Store4(Bf16, void* p, int64_t i, const float v[4]) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]);
  const __nv_bfloat162 b = __floats2bfloat162_rn(v[2], v[3]);
  reinterpret_cast<uint2*>(p)[i / 4] = make_uint2(*reinterpret_cast<const unsigned*>(&a),
                                                  *reinterpret_cast<const unsigned*>(&b));
}
__device__ inline void Store4(Half, void* p, int64_t i, const float v[4]) {
  const __half2 a = __floats2half2_rn(v[0], v[1]);
  const __half2 b = __floats2half2_rn(v[2], v[3]);
  reinterpret_cast<uint2*>(p)[i / 4] = make_uint2(*reinterpret_cast<const unsigned*>(&a),
                                                  *reinterpret_cast<const unsigned*>(&b));
}
__device__ inline void Store4(NoCopy, void*, int64_t, const float[4]) {}

/// Bytes of one element of a tag's storage (0 for NoCopy: nothing is accessed).
__host__ __device__ constexpr int Bytes(F32) { return 4; }
__host__ __device__ constexpr int Bytes(Bf16) { return 2; }
__host__ __device__ constexpr int Bytes(Half) { return 2; }
__host__ __device__ constexpr int Bytes(NoCopy) { return 0; }

/// Whether `p` allows vector accesses of four elements of `bytes` each (null always does).
__device__ inline bool VectorAligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % (kVector * (bytes > 0 ? bytes : 1))) == 0;
}

/// The segment and element range of this block (BlockRange); `*k` is the segment's slot.
__device__ inline const Segment& BlockSegment(const LaunchTable& t, int64_t* begin, int64_t* end, int* k) {
  BlockRange(t, static_cast<int>(blockIdx.x), k, begin, end);
  return t.segments[*k];
}

/// The values one element-wise operation sees: weight, gradient, the two moments, and the
/// segment's aux element (read when Op::kReadsAux, written when Op::kWritesAux).
struct Element {
  float w, g, m, v, aux;
};

/// The element-wise driver. For every element of this block's chunk it loads what the
/// segment has (grad, state0, state1, aux as the op asks), calls op(element, scalar), and
/// stores the weights (fp32 and the low-precision copy, when Op::kWritesWeights), the moments
/// present, and aux (when Op::kWritesAux). Chunks whose arrays are all vector-aligned move
/// four elements per access, so each thread keeps several 16-byte loads in flight. With
/// kSquares, returns the float64 sum of the squares of the gradients this thread loaded (0
/// otherwise).
template <typename P, typename G, bool kSquares, typename Op>
__device__ double ApplyToChunk(const LaunchTable& t, const Op& op) {
  int64_t begin, end;
  int k;
  const Segment& s = BlockSegment(t, &begin, &end, &k);
  float* aux = t.aux[k];
  const float scalar = t.scalar[k];
  const bool vector = VectorAligned(s.master, 4) && VectorAligned(s.grad, Bytes(G{})) &&
                      VectorAligned(s.state0, 4) && VectorAligned(s.state1, 4) &&
                      VectorAligned(aux, 4) && VectorAligned(s.model_param, Bytes(P{}));
  double squares = 0.0;
  auto one = [&](int64_t i) {
    Element e{s.master[i], 0.0f, 0.0f, 0.0f, 0.0f};
    if (s.grad != nullptr) e.g = Load(G{}, s.grad, i);
    if (kSquares) squares = fma(double(e.g), double(e.g), squares);
    if (s.state0 != nullptr) e.m = s.state0[i];
    if (s.state1 != nullptr) e.v = s.state1[i];
    if (Op::kReadsAux) e.aux = aux[i];
    op(e, scalar);
    if (Op::kWritesWeights) {
      s.master[i] = e.w;
      Store(P{}, s.model_param, i, e.w);
    }
    if (s.state0 != nullptr) s.state0[i] = e.m;
    if (s.state1 != nullptr) s.state1[i] = e.v;
    if (Op::kWritesAux) aux[i] = e.aux;
  };
  if (!vector) {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) one(i);
    return squares;
  }
  for (int64_t i = begin + kVector * static_cast<int64_t>(threadIdx.x); i < end; i += kVector * int64_t{blockDim.x}) {
    if (i + kVector > end) {  // the ragged tail of the segment's last chunk
      for (int64_t j = i; j < end; ++j) one(j);
      continue;
    }
    float w[4], g[4] = {}, m[4] = {}, v[4] = {}, a[4] = {};
    Load4(F32{}, s.master, i, w);
    if (s.grad != nullptr) Load4(G{}, s.grad, i, g);
    if (s.state0 != nullptr) Load4(F32{}, s.state0, i, m);
    if (s.state1 != nullptr) Load4(F32{}, s.state1, i, v);
    if (Op::kReadsAux) Load4(F32{}, aux, i, a);
#pragma unroll
    for (int j = 0; j < kVector; ++j) {
      if (kSquares) squares = fma(double(g[j]), double(g[j]), squares);
      Element e{w[j], g[j], m[j], v[j], a[j]};
      op(e, scalar);
      w[j] = e.w; m[j] = e.m; v[j] = e.v; a[j] = e.aux;
    }
    if (Op::kWritesWeights) {
      Store4(F32{}, s.master, i, w);
      Store4(P{}, s.model_param, i, w);
    }
    if (s.state0 != nullptr) Store4(F32{}, s.state0, i, m);
    if (s.state1 != nullptr) Store4(F32{}, s.state1, i, v);
    if (Op::kWritesAux) Store4(F32{}, aux, i, a);
  }
  return squares;
}

/// Calls launch(table, blocks) for each table of ForEachLaunchTable(segments, aux, scalars).
template <typename Launch>
Status ForEachLaunch(absl::Span<const Segment> segments, absl::Span<float* const> aux,
                     absl::Span<const float> scalars, Launch launch) {
  return ForEachLaunchTable(segments, aux, scalars, [&launch](const LaunchTable& table) -> Status {
    launch(table, table.blocks());
    ZERO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  });
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
Status LaunchOverSegments(SegmentTypes types, absl::Span<const Segment> segments,
                          absl::Span<float* const> aux, absl::Span<const float> scalars,
                          LaunchOne launch_one) {
  Status status = absl::OkStatus();
  DispatchTypes<Tags>(types, [&](auto p, auto g) {
    status.Update(ForEachLaunch(segments, aux, scalars, [&](const LaunchTable& t, int blocks) { launch_one(p, g, t, blocks); }));
  });
  return status;
}

}  // namespace zero::kernels::cuda

#endif  // ZERO_KERNELS_CUDA_ELEMENTWISE_CUH_
