// Untracked allocation primitives behind the accounting allocator: host (64-byte aligned),
// page-locked host and CUDA device memory. Only allocator.cc allocates with these; CopyBytes is
// also for copies whose placements are not known in advance (a trainer's pointers).
#ifndef ZERO_BASE_RAW_MEMORY_H_
#define ZERO_BASE_RAW_MEMORY_H_

#include <cstdint>

#include "zero/device.h"
#include "zero/status.h"

namespace zero::base {

/// Allocates `bytes` (> 0) in `placement`. kResourceExhausted when memory runs out;
/// kUnavailable for pinned/device memory without CUDA (build or machine).
StatusOr<void*> AllocateRaw(int64_t bytes, Placement placement);

/// Frees memory from AllocateRaw with the same placement. Null is a no-op.
void FreeRaw(void* data, Placement placement);

/// Host memory of `bytes` (> 0) that reads as zeros without having been written: fresh pages
/// from the kernel (page-aligned), each committed when first touched, so a buffer filled part
/// by part grows the process's resident memory only as it fills.
StatusOr<void*> AllocateZeroPages(int64_t bytes);
/// Frees memory from AllocateZeroPages(bytes). Null is a no-op.
void FreeZeroPages(void* data, int64_t bytes);

/// Copies `bytes` between any two placements (cudaMemcpy with cudaMemcpyDefault when CUDA is
/// built in, memcpy otherwise); synchronous.
Status CopyBytes(void* destination, const void* source, int64_t bytes);

}  // namespace zero::base

#endif  // ZERO_BASE_RAW_MEMORY_H_
