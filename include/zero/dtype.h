// Element types of params, grads and communication buffers, and exact conversions between
// fp32 and the two 16-bit formats.
//
// Conversions round to nearest, ties to even, bit-exact against the IEEE 754 rules: bf16 and
// fp16 subnormals are produced and read exactly, overflow gives ±Inf, NaN stays NaN (quieted,
// sign and top payload bits kept).
#ifndef ZERO_DTYPE_H_
#define ZERO_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "zero/status.h"

namespace zero {

/// Element type. The floating-point values match the C ABI's `zero_dtype` (which has no
/// integer types). Params, gradients and optimizer states are one of the floating-point
/// types; the integer types are for collectives only (hashes, counts, raw bytes), as
/// `ncclInt64` and `ncclUint8` in NCCL: their sums and maxima are exact integer arithmetic,
/// wrapping on overflow (two's complement for int64, modulo 256 for uint8).
enum class DType : int { kFP32 = 0, kBF16 = 1, kFP16 = 2, kInt64 = 3, kUInt8 = 4 };

/// Bytes per element: 4, 2, 2, 8, 1.
size_t DTypeSize(DType dtype);

/// True for fp32, bf16 and fp16: the types a param may have.
bool IsFloatingPoint(DType dtype);

/// Canonical name: "fp32", "bf16", "fp16", "int64", "uint8".
const char* DTypeName(DType dtype);

/// Parses a param dtype: "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16"/"half";
/// anything else (the integer types included) is kInvalidArgument naming the accepted
/// spellings.
StatusOr<DType> ParseDType(std::string_view name);

namespace dtype_internal {
inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace dtype_internal

/// fp32 → bf16 bits, round to nearest even.
inline uint16_t FloatToBf16(float value) {
  uint32_t bits = dtype_internal::FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

/// bf16 bits → fp32 (exact).
inline float Bf16ToFloat(uint16_t bits) {
  return dtype_internal::BitsFloat(static_cast<uint32_t>(bits) << 16);
}

/// fp32 → fp16 bits, round to nearest even, including subnormal results and overflow to Inf.
inline uint16_t FloatToHalf(float value) {
  const uint32_t bits = dtype_internal::FloatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: quiet it, keep the top payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // ≥ 65520 → Inf
  if (magnitude >= 0x38800000u) {  // normal half: rebias the exponent, round off 13 bits
    const uint32_t rebased = magnitude - 0x38000000u;
    uint32_t rounded = rebased >> 13;
    const uint32_t rest = rebased & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (rounded & 1u))) ++rounded;
    return static_cast<uint16_t>(sign | rounded);
  }
  if (magnitude <= 0x33000000u) return static_cast<uint16_t>(sign);  // ≤ 2^-25 → ±0
  // Subnormal half: the value in units of 2^-24, rounded to nearest even. May round up into
  // the smallest normal (0x0400), which is the correct encoding.
  const uint32_t exponent = magnitude >> 23;
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  uint32_t rounded = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (rounded & 1u))) ++rounded;
  return static_cast<uint16_t>(sign | rounded);
}

/// fp16 bits → fp32 (exact).
inline float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f) return dtype_internal::BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
    return dtype_internal::BitsFloat(sign | dtype_internal::FloatBits(magnitude));
  }
  return dtype_internal::BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace zero

#endif  // ZERO_DTYPE_H_
