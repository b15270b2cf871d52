// Helpers for the CPU kernel tests: owned segment storage with fresh random contents, decoding
// of gradient storage, and the list of instruction sets this machine can run.
#ifndef ZERO_TESTS_UNIT_KERNEL_TEST_UTIL_H_
#define ZERO_TESTS_UNIT_KERNEL_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_exec.h"
#include "kernels/segments.h"

namespace zero::testing {

using kernels::Segment;
using kernels::SegmentTypes;

/// Storage for one segment: fp32 master and states, optional low-precision params, and a
/// gradient in any dtype.
struct SegmentStorage {
  std::vector<float> master, state0, state1;
  std::vector<uint16_t> model_param;  // empty for fp32 models
  std::vector<uint16_t> grad16;       // bf16/fp16 gradient bits
  std::vector<float> grad32;          // fp32 gradient

  /// Fills everything with fresh random values: weights in [-1, 1], gradients in [-1, 1],
  /// momenta in [-0.1, 0.1], second moments consistent with them (v ≥ m²/4). The
  /// low-precision params are poisoned (all-ones bits, a NaN in both formats).
  SegmentStorage(int64_t numel, SegmentTypes types, std::mt19937_64& rng);

  /// Decoded gradient element i as the kernel sees it.
  float Grad(int64_t i, DType dtype) const;
  /// The view the kernels take.
  Segment View();
};

/// Instruction sets this CPU runs, narrowest first.
std::vector<base::CpuIsa> SupportedIsas();

/// All (param, grad) dtype combinations.
std::vector<SegmentTypes> AllTypeCombinations();

/// "isa/param/grad" for messages.
std::string Describe(base::CpuIsa isa, SegmentTypes types);

/// Converts fp32 to the bits of `dtype` (bf16 or fp16) exactly.
uint16_t ToLowPrecision(float value, DType dtype);

/// torch.optim.Adam / AdamW for one element in float64: updates w, m, v given the gradient as
/// the kernel reads it.
bool AdamReference(const kernels::AdamHyper& h, double& w, double& m, double& v, double g);

/// torch.optim.SGD for one element in float64 (`buf` is the momentum buffer).
bool SgdReference(const kernels::SgdHyper& h, double& w, double& buf, double g);

/// LAMB's full step in float64 for a segment that is one whole param (bias correction on).
struct LambExpected {
  std::vector<double> weight, m, v;
};
LambExpected LambReference(const kernels::LambHyper& h, const SegmentStorage& init, DType grad_type);

/// Sizes every kernel test covers: one element, a ragged few, and a large odd count that goes
/// multi-threaded and ends in a partial vector and a partial chunk.
inline const std::vector<int64_t>& OddSizes() {
  static const std::vector<int64_t> sizes = {1, 7, 1000003};
  return sizes;
}

}  // namespace zero::testing

#endif  // ZERO_TESTS_UNIT_KERNEL_TEST_UTIL_H_
