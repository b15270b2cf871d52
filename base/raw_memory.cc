// Host, pinned-host and device allocation primitives. CUDA parts compile only when the build
// has CUDA (ZERO_HAVE_CUDA); otherwise pinned and device placements report kUnavailable.
#include "base/raw_memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_converters.h"

#if ZERO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace zero::base {
namespace {

constexpr int64_t kHostAlignment = 64;

[[maybe_unused]] const char* PlacementName(Placement placement) {
  switch (placement) {
    case Placement::kHost: return "host";
    case Placement::kPinnedHost: return "pinned host";
    case Placement::kDevice: return "device";
  }
  return "invalid";
}

}  // namespace

StatusOr<void*> AllocateRaw(int64_t bytes, Placement placement) {
  if (placement == Placement::kHost) {
    const int64_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* data = std::aligned_alloc(kHostAlignment, static_cast<size_t>(rounded));
    if (data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of host memory allocating ", bytes, " bytes"));
    }
    return data;
  }
#if ZERO_HAVE_CUDA
  void* data = nullptr;
  if (placement == Placement::kPinnedHost) {
    ZERO_CUDA_RETURN_IF_ERROR(cudaMallocHost(&data, static_cast<size_t>(bytes)));
  } else {
    ZERO_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, static_cast<size_t>(bytes)));
  }
  return data;
#else
  return absl::UnavailableError(absl::StrCat("cannot allocate ", PlacementName(placement),
                                             " memory: ZeroRT was built without CUDA"));
#endif
}

void FreeRaw(void* data, Placement placement) {
  if (data == nullptr) return;
  switch (placement) {
    case Placement::kHost:
      std::free(data);
      return;
#if ZERO_HAVE_CUDA
    case Placement::kPinnedHost:
      cudaFreeHost(data);
      return;
    case Placement::kDevice:
      cudaFree(data);
      return;
#else
    default:
      return;
#endif
  }
}

StatusOr<void*> AllocateZeroPages(int64_t bytes) {
  void* data = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("out of host memory mapping ", bytes, " bytes"));
  }
  return data;
}

void FreeZeroPages(void* data, int64_t bytes) {
  if (data != nullptr) ::munmap(data, static_cast<size_t>(bytes));
}

Status CopyBytes(void* destination, const void* source, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
#if ZERO_HAVE_CUDA
  if (PlacementOf(destination) == Placement::kDevice || PlacementOf(source) == Placement::kDevice) {
    ZERO_CUDA_RETURN_IF_ERROR(cudaMemcpy(destination, source, static_cast<size_t>(bytes), cudaMemcpyDefault));
    return absl::OkStatus();
  }
#endif
  std::memcpy(destination, source, static_cast<size_t>(bytes));
  return absl::OkStatus();
}

}  // namespace zero::base
