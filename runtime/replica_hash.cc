// A fast 64-bit hash of param values, through host staging for device memory.
#include "runtime/replica_hash.h"

#include <algorithm>
#include <cstring>

namespace zero::runtime {
namespace {

constexpr int64_t kHashChunkBytes = 16 << 20;  // device params are hashed through host chunks
constexpr uint64_t kHashSeed = 0x9E3779B97F4A7C15ull;

// A fast 64-bit hash of bytes (8 bytes per multiply), continuing from `hash`.
uint64_t HashBytes(uint64_t hash, const char* data, int64_t bytes) {
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t word;
    std::memcpy(&word, data + i, 8);
    hash = (hash ^ word) * 0xFF51AFD7ED558CCDull;
    hash ^= hash >> 29;
  }
  for (; i < bytes; ++i) hash = (hash ^ static_cast<unsigned char>(data[i])) * 0x100000001B3ull;
  return hash;
}

}  // namespace

StatusOr<uint64_t> ReplicaHasher::Hash(const void* values, int64_t bytes) {
  if (PlacementOf(values) != Placement::kDevice) {
    return HashBytes(kHashSeed, static_cast<const char*>(values), bytes);
  }
  if (staging_.bytes() < std::min(bytes, kHashChunkBytes)) {
    staging_.Reset();
    ZERO_ASSIGN_OR_RETURN(staging_, allocator_.Allocate(std::min(bytes, kHashChunkBytes),
                                                        MemoryCategory::kWorkspace, Placement::kHost));
  }
  uint64_t hash = kHashSeed;
  for (int64_t done = 0; done < bytes; done += kHashChunkBytes) {
    const int64_t chunk = std::min(kHashChunkBytes, bytes - done);
    ZERO_RETURN_IF_ERROR(ops_.Copy(staging_.data(), static_cast<const char*>(values) + done, chunk));
    hash = HashBytes(hash, staging_.as<char>(), chunk);
  }
  return hash;
}

}  // namespace zero::runtime
