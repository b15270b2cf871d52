// Names and sizes of ZeroRT's element types.
#include "zero/dtype.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace zero {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFP32: return 4;
    case DType::kBF16:
    case DType::kFP16: return 2;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
  }
  return 0;
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFP32 || dtype == DType::kBF16 || dtype == DType::kFP16;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFP32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "invalid";
}

StatusOr<DType> ParseDType(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  if (lower == "fp32" || lower == "float32") return DType::kFP32;
  if (lower == "bf16" || lower == "bfloat16") return DType::kBF16;
  if (lower == "fp16" || lower == "float16" || lower == "half") return DType::kFP16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", std::string(name), "\"; expected fp32, bf16 or fp16"));
}

}  // namespace zero
