// The loop skeleton every CPU kernel shares: segments cut into fixed chunks, chunks spread
// over OpenMP threads, each chunk walked one vector at a time, and the ragged end of a segment
// staged through a small local buffer so it runs the very same vector code as the body.
//
// Because chunk boundaries depend only on the segment sizes, every element takes the same
// code path whatever the thread count: results are bit-identical for any number of threads.
#ifndef ZERO_KERNELS_CPU_ISA_SEGMENT_LOOP_H_
#define ZERO_KERNELS_CPU_ISA_SEGMENT_LOOP_H_

#include <omp.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/isa/loops.h"
#include "kernels/cpu/isa/vec.h"
#include "kernels/type_dispatch.h"

namespace zero::kernels::cpu::ZERO_ISA_NS {
namespace {  // internal linkage: every ISA build has its own copy

/// Below this many elements in total a launch runs on the calling thread only.
constexpr int64_t kParallelThreshold = 1 << 18;

// Element-type tags for templates: fp32, bf16, fp16, and "no low-precision param copy".
struct F32 { using Storage = float; };
struct Bf16 { using Storage = uint16_t; };
struct Half { using Storage = uint16_t; };
struct NoCopy { using Storage = uint16_t; };

inline Vec Load(F32, const void* p) { return LoadF32(static_cast<const float*>(p)); }
inline Vec Load(Bf16, const void* p) { return LoadBf16(static_cast<const uint16_t*>(p)); }
inline Vec Load(Half, const void* p) { return LoadHalf(static_cast<const uint16_t*>(p)); }
inline void Store(Bf16, void* p, Vec x) { StoreBf16(static_cast<uint16_t*>(p), x); }
inline void Store(Half, void* p, Vec x) { StoreHalf(static_cast<uint16_t*>(p), x); }
inline void Store(NoCopy, void*, Vec) {}

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t ChunkCount(int64_t numel) { return (numel + kChunkElems - 1) / kChunkElems; }
inline int ElementBytes(DType dtype) { return dtype == DType::kFP32 ? 4 : 2; }

/// Calls body(segment_index, begin, end) for every chunk of every segment, in parallel when the
/// work is large enough. `numel_of(i)` gives segment i's length.
template <typename NumelOf, typename Body>
void ForEachChunk(int64_t count, int threads, NumelOf numel_of, Body body) {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += numel_of(i);
  const int team = threads > 0 ? threads : omp_get_max_threads();
  if (team <= 1 || total < kParallelThreshold) {
    for (int64_t i = 0; i < count; ++i) {
      for (int64_t c = 0; c < ChunkCount(numel_of(i)); ++c) {
        body(i, c, c * kChunkElems, Min(numel_of(i), (c + 1) * kChunkElems));
      }
    }
    return;
  }
#pragma omp parallel num_threads(team)
  for (int64_t i = 0; i < count; ++i) {
    const int64_t numel = numel_of(i);
    const int64_t chunks = ChunkCount(numel);
#pragma omp for schedule(static) nowait
    for (int64_t c = 0; c < chunks; ++c) {
      body(i, c, c * kChunkElems, Min(numel, (c + 1) * kChunkElems));
    }
  }
}

/// The parallel arrays of one segment (null where a kernel does not use one).
struct Pointers {
  float* master;
  void* model_param;
  const void* grad;
  float* state0;
  float* state1;
  const float* update;  ///< LAMB's update direction, read by the apply pass
  float* update_out;    ///< LAMB's update direction, written by the update pass
};

/// `p` moved forward by `offset` elements of `bytes` each; null stays null.
template <typename T>
T* Advance(T* p, int64_t offset, int bytes) {
  if (p == nullptr) return p;
  using Void = std::conditional_t<std::is_const_v<T>, const void, void>;
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  Byte* byte = static_cast<Byte*>(static_cast<Void*>(p));
  return static_cast<T*>(static_cast<Void*>(byte + offset * bytes));
}

inline Pointers PointersAt(const Pointers& base, int64_t offset, int param_bytes,
                           int grad_bytes) {
  return {Advance(base.master, offset, 4),        Advance(base.model_param, offset, param_bytes),
          Advance(base.grad, offset, grad_bytes), Advance(base.state0, offset, 4),
          Advance(base.state1, offset, 4),        Advance(base.update, offset, 4),
          Advance(base.update_out, offset, 4)};
}

/// Runs op(pointers) on every full vector of [begin, end) of `base`, then on the ragged tail
/// through zero-padded local copies, writing back only the tail's real elements.
template <typename Op>
void ForEachVector(const Pointers& base, int64_t begin, int64_t end, int param_bytes,
                   int grad_bytes, Op op) {
  constexpr int kLanes = Vec::kLanes;
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) op(PointersAt(base, i, param_bytes, grad_bytes));
  if (i >= end) return;
  const size_t rest = static_cast<size_t>(end - i);  // 1 .. kLanes-1
  alignas(64) float master[kLanes] = {}, state0[kLanes] = {}, state1[kLanes] = {};
  alignas(64) float update[kLanes] = {}, update_out[kLanes] = {};
  alignas(64) char model_param[kLanes * 4] = {}, grad[kLanes * 4] = {};
  const Pointers src = PointersAt(base, i, param_bytes, grad_bytes);
  auto stage = [rest](auto* local, const void* from, int bytes) -> decltype(local) {
    if (from == nullptr) return nullptr;
    std::memcpy(local, from, rest * static_cast<size_t>(bytes));
    return local;
  };
  const Pointers staged = {stage(master, src.master, 4),          stage(model_param, src.model_param, param_bytes),
                        stage(grad, src.grad, grad_bytes),     stage(state0, src.state0, 4),
                        stage(state1, src.state1, 4),          stage(update, src.update, 4),
                        stage(update_out, src.update_out, 4)};
  op(staged);
  auto unstage = [rest](void* to, const void* local, int bytes) {
    if (to != nullptr) std::memcpy(to, local, rest * static_cast<size_t>(bytes));
  };
  unstage(src.master, master, 4);
  unstage(src.model_param, model_param, param_bytes);
  unstage(src.state0, state0, 4);
  unstage(src.state1, state1, 4);
  unstage(src.update_out, update_out, 4);
}

/// Runs a per-vector optimizer op over all segments, multi-threaded by chunks.
template <typename Op>
void ForEachSegmentVector(SegmentTypes types, const Segment* segments, int64_t count,
                          int threads, Op op) {
  const int param_bytes = ElementBytes(types.param);
  const int grad_bytes = ElementBytes(types.grad);
  ForEachChunk(
      count, threads, [segments](int64_t i) { return segments[i].numel; },
      [&](int64_t i, int64_t, int64_t begin, int64_t end) {
        const Segment& s = segments[i];
        const Pointers base = {s.master, s.model_param, s.grad, s.state0, s.state1, nullptr, nullptr};
        ForEachVector(base, begin, end, param_bytes, grad_bytes, op);
      });
}

/// This build's element-type tags, for kernels::DispatchTypes.
struct Tags {
  using F32 = ZERO_ISA_NS::F32;
  using Bf16 = ZERO_ISA_NS::Bf16;
  using Half = ZERO_ISA_NS::Half;
  using NoCopy = ZERO_ISA_NS::NoCopy;
};

/// Calls fn(ParamTag{}, GradTag{}) with this build's tags matching `types`.
template <typename Fn>
void DispatchTypes(SegmentTypes types, Fn fn) {
  kernels::DispatchTypes<Tags>(types, fn);
}

}  // namespace
}  // namespace zero::kernels::cpu::ZERO_ISA_NS

#endif  // ZERO_KERNELS_CPU_ISA_SEGMENT_LOOP_H_
