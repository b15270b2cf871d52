// Turns a segment list's run-time element types into compile-time tags, for the CPU loops and
// the CUDA kernels alike.
#ifndef ZERO_KERNELS_TYPE_DISPATCH_H_
#define ZERO_KERNELS_TYPE_DISPATCH_H_

#include "kernels/segments.h"

namespace zero::kernels {

/// Calls fn(ParamTag{}, GradTag{}) for `types`. `Tags` names the caller's tag types: F32, Bf16
/// and Half for element storage, NoCopy for "fp32 model, no low-precision copy". Each caller
/// (every CPU instruction-set build, the CUDA kernels) instantiates it with its own tags.
template <typename Tags, typename Fn>
void DispatchTypes(SegmentTypes types, Fn fn) {
  auto with_grad = [&](auto param_tag) {
    switch (types.grad) {
      case DType::kFP32: return fn(param_tag, typename Tags::F32{});
      case DType::kBF16: return fn(param_tag, typename Tags::Bf16{});
      case DType::kFP16: return fn(param_tag, typename Tags::Half{});
      case DType::kInt64:
      case DType::kUInt8: return;  // not param types: CheckSegments refuses them first
    }
  };
  switch (types.param) {
    case DType::kFP32: return with_grad(typename Tags::NoCopy{});
    case DType::kBF16: return with_grad(typename Tags::Bf16{});
    case DType::kFP16: return with_grad(typename Tags::Half{});
    case DType::kInt64:
    case DType::kUInt8: return;  // not param types: CheckSegments refuses them first
  }
}

}  // namespace zero::kernels

#endif  // ZERO_KERNELS_TYPE_DISPATCH_H_
