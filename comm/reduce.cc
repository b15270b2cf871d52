// Host elementwise reductions.
#include "comm/reduce.h"

#include <algorithm>

namespace zero::comm {
namespace {

float LoadAt(const void* p, int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kFP32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kFP16: return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
  }
  return 0.0f;
}

void StoreAt(void* p, int64_t i, DType dtype, float value) {
  switch (dtype) {
    case DType::kFP32: static_cast<float*>(p)[i] = value; return;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = FloatToBf16(value); return;
    case DType::kFP16: static_cast<uint16_t*>(p)[i] = FloatToHalf(value); return;
  }
}

template <typename Combine>
void Reduce(void* out, const void* const* inputs, int num_inputs, int64_t count, DType dtype,
            Combine combine) {
  for (int64_t i = 0; i < count; ++i) {
    float acc = LoadAt(inputs[0], i, dtype);
    for (int k = 1; k < num_inputs; ++k) acc = combine(acc, LoadAt(inputs[k], i, dtype));
    StoreAt(out, i, dtype, acc);
  }
}

}  // namespace

void ReduceInto(void* out, const void* const* inputs, int num_inputs, int64_t count, DType dtype,
                ReduceOp op) {
  if (op == ReduceOp::kSum) {
    Reduce(out, inputs, num_inputs, count, dtype, [](float a, float b) { return a + b; });
  } else {
    Reduce(out, inputs, num_inputs, count, dtype, [](float a, float b) { return std::max(a, b); });
  }
}

}  // namespace zero::comm
