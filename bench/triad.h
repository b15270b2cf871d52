// The memory-bandwidth roofline for CPU kernels: the STREAM triad a[i] = b[i] + s·c[i],
// counted as 12 bytes per element, as REFERENCE.md's figures are.
#ifndef ZERO_BENCH_TRIAD_H_
#define ZERO_BENCH_TRIAD_H_

#include <cstdint>

namespace zero::bench {

/// Bytes the triad is credited with per element (read b and c, write a).
inline constexpr double kTriadBytesPerElement = 12.0;

/// One triad pass over n elements with `threads` OpenMP threads (0 = all cores).
void Triad(float* a, const float* b, const float* c, float s, int64_t n, int threads);

/// Best-of-`repeats` triad bandwidth in bytes/s over n elements (allocates and first-touches
/// its own arrays with the same thread count).
double MeasureTriadBandwidth(int64_t n, int threads, int repeats = 5);

}  // namespace zero::bench

#endif  // ZERO_BENCH_TRIAD_H_
