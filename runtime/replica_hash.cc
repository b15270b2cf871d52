// XXH3 (as the checkpoint checksums) of param values, through host staging for device memory.
#include "runtime/replica_hash.h"

#include <algorithm>

// Header-only XXH3 (Debian's libxxhash-dev): nothing to link.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace zero::runtime {
namespace {

constexpr int64_t kHashChunkBytes = 16 << 20;  // device values are hashed through host chunks

}  // namespace

StatusOr<uint64_t> ReplicaHasher::Hash(const void* values, int64_t bytes) {
  if (PlacementOf(values) != Placement::kDevice) return XXH3_64bits(values, static_cast<size_t>(bytes));
  if (staging_.bytes() < std::min(bytes, kHashChunkBytes)) {
    staging_.Reset();
    ZERO_ASSIGN_OR_RETURN(staging_, allocator_.Allocate(std::min(bytes, kHashChunkBytes),
                                                        MemoryCategory::kWorkspace, Placement::kHost));
  }
  // Streaming over the chunks gives the one-shot hash of the same bytes (as on the host path).
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (int64_t done = 0; done < bytes; done += kHashChunkBytes) {
    const int64_t chunk = std::min(kHashChunkBytes, bytes - done);
    ZERO_RETURN_IF_ERROR(ops_.Copy(staging_.data(), static_cast<const char*>(values) + done, chunk));
    XXH3_64bits_update(&state, staging_.data(), static_cast<size_t>(chunk));
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace zero::runtime
