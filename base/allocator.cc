// The accounting allocator and its tracker.
#include "base/allocator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/raw_memory.h"

namespace zero::base {

void MemoryTracker::Add(MemoryCategory category, int64_t bytes) {
  const int index = static_cast<int>(category);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.current[index] += bytes;
  stats_.peak[index] = std::max(stats_.peak[index], stats_.current[index]);
  stats_.total_current += bytes;
  stats_.total_peak = std::max(stats_.total_peak, stats_.total_current);
}

void MemoryTracker::Remove(MemoryCategory category, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.current[static_cast<int>(category)] -= bytes;
  stats_.total_current -= bytes;
}

MemoryStats MemoryTracker::Snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

Buffer::Buffer(Buffer&& other) noexcept { *this = std::move(other); }

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    placement_ = other.placement_;
    category_ = other.category_;
    zero_pages_ = std::exchange(other.zero_pages_, false);
    give_back_ = std::exchange(other.give_back_, nullptr);
    tracker_ = std::move(other.tracker_);
  }
  return *this;
}

Buffer::~Buffer() { Reset(); }

void Buffer::Reset() {
  if (tracker_ != nullptr && tracker_->keeps_allocations()) {  // kept on purpose: see the header
    data_ = nullptr;
    bytes_ = 0;
    zero_pages_ = false;
    give_back_ = nullptr;
    tracker_.reset();
    return;
  }
  if (give_back_ != nullptr) {
    std::exchange(give_back_, nullptr)();
  } else if (zero_pages_) {
    FreeZeroPages(data_, bytes_);
  } else if (data_ != nullptr) {
    FreeRaw(data_, placement_);
  }
  if (tracker_ != nullptr && bytes_ > 0) tracker_->Remove(category_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
  zero_pages_ = false;
  tracker_.reset();
}

Allocator::Allocator() : tracker_(std::make_shared<MemoryTracker>()) {}

StatusOr<Buffer> Allocator::Allocate(int64_t bytes, MemoryCategory category,
                                     Placement placement) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot allocate a negative size (", bytes,
                                                   " bytes) for ",
                                                   MemoryCategoryName(category)));
  }
  Buffer buffer;
  buffer.placement_ = placement;
  buffer.category_ = category;
  if (bytes == 0) return buffer;
  ZERO_ASSIGN_OR_RETURN(buffer.data_, AllocateRaw(bytes, placement));
  buffer.bytes_ = bytes;
  buffer.tracker_ = tracker_;
  tracker_->Add(category, bytes);
  return buffer;
}

Buffer Allocator::Borrow(void* data, int64_t bytes, MemoryCategory category, Placement placement,
                         std::function<void()> give_back) {
  Buffer buffer;
  buffer.placement_ = placement;
  buffer.category_ = category;
  buffer.data_ = data;
  buffer.bytes_ = bytes;
  buffer.give_back_ = std::move(give_back);
  buffer.tracker_ = tracker_;
  if (bytes > 0) tracker_->Add(category, bytes);
  return buffer;
}

StatusOr<Buffer> Allocator::AllocateZeroed(int64_t bytes, MemoryCategory category, Placement placement) {
  if (placement != Placement::kHost || bytes <= 0) return Allocate(bytes, category, placement);
  Buffer buffer;
  buffer.placement_ = placement;
  buffer.category_ = category;
  ZERO_ASSIGN_OR_RETURN(buffer.data_, AllocateZeroPages(bytes));
  buffer.zero_pages_ = true;
  buffer.bytes_ = bytes;
  buffer.tracker_ = tracker_;
  tracker_->Add(category, bytes);
  return buffer;
}

}  // namespace zero::base

namespace zero {

const char* MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParams: return "params";
    case MemoryCategory::kGrads: return "grads";
    case MemoryCategory::kOptimizer: return "optimizer";
    case MemoryCategory::kCommBuffers: return "comm_buffers";
    case MemoryCategory::kGathered: return "gathered";
    case MemoryCategory::kWorkspace: return "workspace";
  }
  return "invalid";
}

}  // namespace zero
