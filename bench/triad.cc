// STREAM-style triad for the CPU roofline.
#include "bench/triad.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <memory>

namespace zero::bench {

void Triad(float* a, const float* b, const float* c, float s, int64_t n, int threads) {
  const int team = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for simd schedule(static) num_threads(team)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

double MeasureTriadBandwidth(int64_t n, int threads, int repeats) {
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  const int team = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 0.0f;
    b[i] = 1.0f;
    c[i] = 2.0f;
  }
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    Triad(a.get(), b.get(), c.get(), 3.0f, n, threads);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    best = std::min(best, elapsed.count());
  }
  return kTriadBytesPerElement * static_cast<double>(n) / best;
}

}  // namespace zero::bench
