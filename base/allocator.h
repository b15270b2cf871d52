// The accounting allocator: every buffer the runtime holds is allocated here, tagged with a
// MemoryCategory, and counted until it is freed. MemoryStats (current and peak per category)
// is what the engine's MemoryStats() and the stage-2-versus-3 memory benchmark read.
#ifndef ZERO_BASE_ALLOCATOR_H_
#define ZERO_BASE_ALLOCATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "zero/device.h"
#include "zero/memory.h"
#include "zero/status.h"

namespace zero::base {

/// Thread-safe byte counters: current and peak per category and in total.
class MemoryTracker {
 public:
  /// Records `bytes` (≥ 0) newly held in `category`.
  void Add(MemoryCategory category, int64_t bytes);
  /// Records `bytes` (≥ 0) released from `category`.
  void Remove(MemoryCategory category, int64_t bytes);
  /// A consistent copy of all counters.
  MemoryStats Snapshot() const;
  /// While `keep()` returns true, buffers of this tracker are not freed when destroyed or Reset
  /// (they stay counted): for memory that collectives which cannot be cancelled may still use.
  /// Set once, before the first allocation.
  void KeepAllocationsWhen(std::function<bool()> keep) { keep_when_ = std::move(keep); }
  bool keeps_allocations() const { return keep_when_ && keep_when_(); }

 private:
  mutable std::mutex mutex_;
  MemoryStats stats_;
  std::function<bool()> keep_when_;
};

/// One owned allocation. Move-only; frees its memory and un-counts it when destroyed or Reset.
/// Host and pinned buffers are 64-byte aligned (a full AVX-512 vector / cache line).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  int64_t bytes() const { return bytes_; }
  Placement placement() const { return placement_; }
  MemoryCategory category() const { return category_; }
  /// Whether the memory reads as zeros without having been written (AllocateZeroed on the
  /// host), so its owner need not zero it.
  bool reads_as_zero() const { return zero_pages_; }
  /// Whether the memory is lent by someone else (Allocator::Borrow): Reset gives it back.
  bool borrowed() const { return give_back_ != nullptr; }

  /// Frees the memory now; the buffer becomes empty.
  void Reset();

 private:
  friend class Allocator;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Placement placement_ = Placement::kHost;
  MemoryCategory category_ = MemoryCategory::kWorkspace;
  bool zero_pages_ = false;  // from AllocateZeroPages
  std::function<void()> give_back_;  // from Borrow: called instead of freeing
  std::shared_ptr<MemoryTracker> tracker_;
};

/// Allocates tagged, accounted buffers. Cheap to copy: copies share one tracker, so an engine
/// hands copies to its layers and reads one set of totals.
class Allocator {
 public:
  Allocator();

  /// Allocates `bytes` (≥ 0) in `placement`, counted under `category`. Zero bytes gives an
  /// empty buffer. Errors: kInvalidArgument for negative sizes, kResourceExhausted when the
  /// memory is not available (naming the category and size), kUnavailable for device or
  /// pinned placements in a build without CUDA or on a machine without a GPU.
  StatusOr<Buffer> Allocate(int64_t bytes, MemoryCategory category, Placement placement);
  /// As Allocate, for a buffer that must start at zero: on the host, fresh pages that read as
  /// zeros and are committed only as they are written (Buffer::reads_as_zero); elsewhere an
  /// ordinary allocation the caller zeroes.
  StatusOr<Buffer> AllocateZeroed(int64_t bytes, MemoryCategory category, Placement placement);
  /// A buffer over `bytes` of memory at `data` that someone else lent, counted under
  /// `category` as if allocated: when the buffer is destroyed or Reset, `give_back` is called
  /// instead of freeing (not while the tracker keeps allocations: the lender keeps it then).
  Buffer Borrow(void* data, int64_t bytes, MemoryCategory category, Placement placement,
                std::function<void()> give_back);

  /// Current and peak bytes per category over every buffer this allocator (or a copy) made.
  MemoryStats Stats() const { return tracker_->Snapshot(); }
  /// Buffers made by this allocator (or a copy) are not freed while `keep()` is true: see
  /// MemoryTracker::KeepAllocationsWhen. A deliberate leak, for after a communicator broke.
  void KeepAllocationsWhen(std::function<bool()> keep) { tracker_->KeepAllocationsWhen(std::move(keep)); }

 private:
  std::shared_ptr<MemoryTracker> tracker_;
};

}  // namespace zero::base

#endif  // ZERO_BASE_ALLOCATOR_H_
