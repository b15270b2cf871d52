// Memory accounting categories and the per-category statistics the engine reports.
//
// Every byte the runtime allocates is tagged with one category; MemoryStats reports the bytes
// held now and the high-water mark of each category and of their sum.
#ifndef ZERO_MEMORY_H_
#define ZERO_MEMORY_H_

#include <array>
#include <cstdint>

namespace zero {

/// What an allocation is for. Values match the C ABI's ZERO_MEM_* constants.
enum class MemoryCategory : int {
  kParams = 0,       ///< params (full copies, or the rank's shard at stage 3)
  kGrads = 1,        ///< persistent gradient storage (full, or the rank's shard)
  kOptimizer = 2,    ///< fp32 master weights and optimizer moments
  kCommBuffers = 3,  ///< bucket buffers being filled or in flight, staging buffers
  kGathered = 4,     ///< stage-3 units gathered for compute
  kWorkspace = 5,    ///< scratch: norm partials, kernel workspaces
};

/// Number of MemoryCategory values.
inline constexpr int kMemoryCategoryCount = 6;

/// Name of a category: "params", "grads", "optimizer", "comm_buffers", "gathered", "workspace".
const char* MemoryCategoryName(MemoryCategory category);

/// Bytes held per category: now (`current`) and the most ever held at once (`peak`).
/// `total_peak` is the high-water mark of the sum over categories, which can be smaller than
/// the sum of the per-category peaks.
struct MemoryStats {
  std::array<int64_t, kMemoryCategoryCount> current{};
  std::array<int64_t, kMemoryCategoryCount> peak{};
  int64_t total_current = 0;
  int64_t total_peak = 0;

  int64_t Current(MemoryCategory c) const { return current[static_cast<int>(c)]; }
  int64_t Peak(MemoryCategory c) const { return peak[static_cast<int>(c)]; }
};

}  // namespace zero

#endif  // ZERO_MEMORY_H_
