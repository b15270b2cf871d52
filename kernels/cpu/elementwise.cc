// Host element-wise operations.
#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace zero::kernels {
namespace {

// Element formats: how to read an element into the accumulator type (fp32 for the floating
// types, exact integers otherwise) and write it back.
struct F32 {
  using T = float;
  using Acc = float;
  static float Load(T x) { return x; }
  static T Store(float x) { return x; }
};
struct Bf16 {
  using T = uint16_t;
  using Acc = float;
  static float Load(T x) { return Bf16ToFloat(x); }
  static T Store(float x) { return FloatToBf16(x); }
};
struct Half {
  using T = uint16_t;
  using Acc = float;
  static float Load(T x) { return HalfToFloat(x); }
  static T Store(float x) { return FloatToHalf(x); }
};
struct Int64 {
  using T = int64_t;
  using Acc = int64_t;
  static Acc Load(T x) { return x; }
  static T Store(Acc x) { return x; }
};
struct UInt8 {  // sums wrap modulo 256, as NCCL's (OpenMPI's MPI_SUM saturates: mpi_ops.h)
  using T = uint8_t;
  using Acc = uint32_t;
  static Acc Load(T x) { return x; }
  static T Store(Acc x) { return static_cast<T>(x); }
};

// Blocks keep the accumulator in cache while each input streams through once.
constexpr int64_t kBlock = 4096;

template <typename Format, typename Op>
void Reduce(void* out, const void* const* inputs, int num_inputs, int64_t count, Op combine) {
  using T = typename Format::T;
  typename Format::Acc acc[kBlock];
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    const T* first = static_cast<const T*>(inputs[0]) + begin;
    for (int64_t i = 0; i < n; ++i) acc[i] = Format::Load(first[i]);
    for (int k = 1; k < num_inputs; ++k) {
      const T* in = static_cast<const T*>(inputs[k]) + begin;
      for (int64_t i = 0; i < n; ++i) acc[i] = combine(acc[i], Format::Load(in[i]));
    }
    T* destination = static_cast<T*>(out) + begin;
    for (int64_t i = 0; i < n; ++i) destination[i] = Format::Store(acc[i]);
  }
}

template <typename Format>
void ReduceFormat(void* out, const void* const* inputs, int num_inputs, int64_t count,
                  Combine combine) {
  using Acc = typename Format::Acc;
  if (combine == Combine::kSum) {
    Reduce<Format>(out, inputs, num_inputs, count, [](Acc a, Acc b) -> Acc {
      if constexpr (std::is_integral_v<Acc>) {  // wraps (two's complement), never undefined
        using Unsigned = std::make_unsigned_t<Acc>;
        return static_cast<Acc>(static_cast<Unsigned>(a) + static_cast<Unsigned>(b));
      } else {
        return a + b;
      }
    });
  } else {
    Reduce<Format>(out, inputs, num_inputs, count, [](Acc a, Acc b) { return std::max(a, b); });
  }
}

// accumulator[i] += Format::Load(addend[i]): a plain loop the compiler vectorises (the bf16
// widening is a shift; no aliasing between the two arrays).
template <typename Format>
void AddWidened(float* __restrict accumulator, const void* addend, int64_t numel) {
  const typename Format::T* __restrict in = static_cast<const typename Format::T*>(addend);
  for (int64_t i = 0; i < numel; ++i) accumulator[i] += Format::Load(in[i]);
}

}  // namespace

void ReduceInto(void* out, const void* const* inputs, int num_inputs, int64_t count, DType dtype,
                Combine combine) {
  switch (dtype) {
    case DType::kFP32: return ReduceFormat<F32>(out, inputs, num_inputs, count, combine);
    case DType::kBF16: return ReduceFormat<Bf16>(out, inputs, num_inputs, count, combine);
    case DType::kFP16: return ReduceFormat<Half>(out, inputs, num_inputs, count, combine);
    case DType::kInt64: return ReduceFormat<Int64>(out, inputs, num_inputs, count, combine);
    case DType::kUInt8: return ReduceFormat<UInt8>(out, inputs, num_inputs, count, combine);
  }
}

void AddIntoCpu(void* accumulator, const void* addend, int64_t numel, DType dtype) {
  const void* inputs[2] = {accumulator, addend};
  ReduceInto(accumulator, inputs, 2, numel, dtype, Combine::kSum);
}

void AddIntoFloatCpu(float* accumulator, const void* addend, int64_t numel, DType addend_dtype) {
  switch (addend_dtype) {
    case DType::kFP32: return AddWidened<F32>(accumulator, addend, numel);
    case DType::kBF16: return AddWidened<Bf16>(accumulator, addend, numel);
    case DType::kFP16: return AddWidened<Half>(accumulator, addend, numel);
    case DType::kInt64:
    case DType::kUInt8: return;  // not param types (elementwise.h)
  }
}

void WidenCpu(float* out, const void* in, int64_t numel, DType dtype) {
  const uint16_t* bits = static_cast<const uint16_t*>(in);
  switch (dtype) {
    case DType::kFP32: std::memcpy(out, in, static_cast<size_t>(numel) * 4); break;
    case DType::kBF16: for (int64_t i = 0; i < numel; ++i) out[i] = Bf16ToFloat(bits[i]); break;
    case DType::kFP16: for (int64_t i = 0; i < numel; ++i) out[i] = HalfToFloat(bits[i]); break;
    case DType::kInt64:
    case DType::kUInt8: break;  // not param types (elementwise.h)
  }
}

void NarrowCpu(void* out, const float* in, int64_t numel, DType dtype) {
  uint16_t* bits = static_cast<uint16_t*>(out);
  switch (dtype) {
    case DType::kFP32: std::memcpy(out, in, static_cast<size_t>(numel) * 4); break;
    case DType::kBF16: for (int64_t i = 0; i < numel; ++i) bits[i] = FloatToBf16(in[i]); break;
    case DType::kFP16: for (int64_t i = 0; i < numel; ++i) bits[i] = FloatToHalf(in[i]); break;
    case DType::kInt64:
    case DType::kUInt8: break;  // not param types (elementwise.h)
  }
}

}  // namespace zero::kernels
