// Sums of squares in float64, one partial per fixed chunk, for global-norm clipping, LAMB's
// trust ratios and the overflow check (an Inf or NaN makes its partial non-finite).
// Compiled once per instruction set; see loops.h.
#include "kernels/cpu/isa/segment_loop.h"

namespace zero::kernels::cpu::ZERO_ISA_NS {

void SquaresLoop(DType dtype, const ConstSpan* spans, int64_t count, double* partials,
                 int threads) {
  const int bytes = ElementBytes(dtype);
  DispatchTypes({DType::kFP32, dtype}, [&](auto, auto tag) {
    // Chunk partials are laid out span-major: span i's chunks start at first_chunk[i], which
    // every thread derives the same way.
    ForEachChunk(
        count, threads, [spans](int64_t i) { return spans[i].numel; },
        [&](int64_t i, int64_t chunk, int64_t begin, int64_t end) {
          int64_t first_chunk = 0;
          for (int64_t j = 0; j < i; ++j) first_chunk += ChunkCount(spans[j].numel);
          SquareSum sum;
          const Pointers base = {nullptr, nullptr, spans[i].data, nullptr, nullptr, nullptr, nullptr};
          ForEachVector(base, begin, end, 2, bytes,
                        [&](const Pointers& p) { AccumulateSquares(sum, Load(tag, p.grad)); });
          partials[first_chunk + chunk] = Total(sum);
        });
  });
}

}  // namespace zero::kernels::cpu::ZERO_ISA_NS
