// The communicator conformance suite.
#include "tests/comm/conformance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/raw_memory.h"

namespace zero::testing {
namespace {

using comm::CollectiveKind;
using comm::ReduceOp;

// The input every rank contributes, known to every rank: element i of rank r in case `seed`,
// a fresh value in [-1, 1] rounded to `dtype`; for int64 an integer in [-2^46, 2^46) (sums
// over up to 64 ranks stay exact in a double), for uint8 one in [0, 256).
double Input(int rank, int64_t i, uint64_t seed, DType dtype) {
  uint64_t x = (static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull) ^
               (seed * 0x94D049BB133111EBull);
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  const float value = static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 2 - 1);
  switch (dtype) {
    case DType::kFP32: return value;
    case DType::kBF16: return Bf16ToFloat(FloatToBf16(value));
    case DType::kFP16: return HalfToFloat(FloatToHalf(value));
    case DType::kInt64: return static_cast<double>(static_cast<int64_t>(x >> 17) - (int64_t{1} << 46));
    case DType::kUInt8: return static_cast<double>(x >> 56);
  }
  return value;
}

// A typed buffer: values are set and read on the host; collectives see `at()`, which is a CUDA
// device mirror when the suite runs on device buffers (Upload before, Download after).
struct Buffer {
  DType dtype;
  std::vector<char> bytes;
  void* device = nullptr;
  Status allocated;  // a device allocation that failed fails the case at Upload
  Buffer(DType d, int64_t n, uint8_t poison, Placement placement) : dtype(d), bytes(n * DTypeSize(d), poison) {
    if (placement == Placement::kDevice && !bytes.empty()) {
      auto memory = base::AllocateRaw(static_cast<int64_t>(bytes.size()), Placement::kDevice);
      if (memory.ok()) device = *memory; else allocated = memory.status();
    }
  }
  ~Buffer() { base::FreeRaw(device, Placement::kDevice); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* at(int64_t i) { return (device ? static_cast<char*>(device) : bytes.data()) + i * DTypeSize(dtype); }
  Status Upload() {
    ZERO_RETURN_IF_ERROR(allocated);
    return device ? base::CopyBytes(device, bytes.data(), bytes.size()) : absl::OkStatus();
  }
  Status Download() { return device ? base::CopyBytes(bytes.data(), device, bytes.size()) : absl::OkStatus(); }
  void* host(int64_t i) { return bytes.data() + i * DTypeSize(dtype); }
  void Set(int64_t i, double v) {
    if (dtype == DType::kInt64 || dtype == DType::kUInt8) {
      const int64_t integer = static_cast<int64_t>(v);
      const uint8_t byte = static_cast<uint8_t>(integer);
      std::memcpy(host(i), dtype == DType::kInt64 ? static_cast<const void*>(&integer) : &byte, DTypeSize(dtype));
    } else if (dtype == DType::kFP32) {
      const float f = static_cast<float>(v);
      std::memcpy(host(i), &f, 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? FloatToBf16(static_cast<float>(v))
                                               : FloatToHalf(static_cast<float>(v));
      std::memcpy(host(i), &h, 2);
    }
  }
  double Get(int64_t i) {
    if (dtype == DType::kInt64) {
      int64_t integer;
      std::memcpy(&integer, host(i), 8);
      return static_cast<double>(integer);
    }
    if (dtype == DType::kUInt8) return *static_cast<const uint8_t*>(host(i));
    if (dtype == DType::kFP32) {
      float f;
      std::memcpy(&f, host(i), 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, host(i), 2);
    return dtype == DType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
  }
};

double UnitRoundoff(DType dtype) {
  switch (dtype) {
    case DType::kFP32: return std::ldexp(1.0, -24);
    case DType::kBF16: return std::ldexp(1.0, -8);
    case DType::kFP16: return std::ldexp(1.0, -11);
    case DType::kInt64:
    case DType::kUInt8: return 0;  // exact
  }
  return 0;
}

struct Case {
  CollectiveKind kind;
  DType dtype;
  ReduceOp op;
  int64_t count;
  bool in_place;
  int root;
  uint64_t seed;

  std::string Name() const {
    return absl::StrCat(comm::CollectiveSignature{kind, count, dtype, op, root}.ToString(),
                        in_place ? " in place" : "");
  }
};

// Reduction of element `i` (global index into the full input) over ranks: the exact float64
// value, and how far a correct backend may be from it.
void Expected(const Case& c, int size, int64_t i, bool pairwise, double* value, double* slack) {
  double sum = 0, magnitude = 0, maximum = -INFINITY;
  for (int r = 0; r < size; ++r) {
    const double x = Input(r, i, c.seed, c.dtype);
    sum += x;
    magnitude += std::fabs(x);
    maximum = std::max(maximum, x);
  }
  if (c.op == ReduceOp::kMax) {
    *value = maximum;
    *slack = 0;
    return;
  }
  if (!IsFloatingPoint(c.dtype)) {  // exact; uint8 sums wrap modulo 256
    *value = c.dtype == DType::kUInt8 ? std::fmod(sum, 256.0) : sum;
    *slack = 0;
    return;
  }
  *value = sum;
  // fp32 accumulation, then one rounding to the dtype (or one per combining step).
  const double roundings = pairwise ? size : 1;
  *slack = size * std::ldexp(1.0, -24) * magnitude + roundings * UnitRoundoff(c.dtype) * magnitude;
}

Status Compare(const Case& c, int rank, int64_t i, double got, double want, double slack) {
  if (std::fabs(got - want) <= slack) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(c.Name(), " on rank ", rank, ": element ", i, " is ",
                                          got, ", expected ", want, " ± ", slack));
}

Status RunCase(comm::Communicator& comm, const Case& c, bool pairwise, Placement placement) {
  const int rank = comm.rank(), size = comm.size();
  const int64_t n = c.count;
  switch (c.kind) {
    case CollectiveKind::kReduceScatter: {
      Buffer send(c.dtype, size * n, 0, placement);
      for (int64_t i = 0; i < size * n; ++i) send.Set(i, Input(rank, i, c.seed, c.dtype));
      Buffer recv(c.dtype, n, 0xff, placement);  // poisoned
      ZERO_RETURN_IF_ERROR(send.Upload());
      ZERO_RETURN_IF_ERROR(recv.Upload());
      void* out = c.in_place ? send.at(rank * n) : recv.at(0);
      ZERO_RETURN_IF_ERROR(comm.ReduceScatter(send.at(0), out, n, c.dtype, c.op)->Wait());
      Buffer& result = c.in_place ? send : recv;
      ZERO_RETURN_IF_ERROR(result.Download());
      const int64_t offset = c.in_place ? rank * n : 0;
      for (int64_t i = 0; i < n; ++i) {
        double want, slack;
        Expected(c, size, rank * n + i, pairwise, &want, &slack);
        ZERO_RETURN_IF_ERROR(Compare(c, rank, i, result.Get(offset + i), want, slack));
      }
      return absl::OkStatus();
    }
    case CollectiveKind::kAllReduce: {
      Buffer send(c.dtype, n, 0, placement), recv(c.dtype, n, 0xff, placement);
      for (int64_t i = 0; i < n; ++i) send.Set(i, Input(rank, i, c.seed, c.dtype));
      ZERO_RETURN_IF_ERROR(send.Upload());
      ZERO_RETURN_IF_ERROR(recv.Upload());
      Buffer& result = c.in_place ? send : recv;
      ZERO_RETURN_IF_ERROR(comm.AllReduce(send.at(0), result.at(0), n, c.dtype, c.op)->Wait());
      ZERO_RETURN_IF_ERROR(result.Download());
      for (int64_t i = 0; i < n; ++i) {
        double want, slack;
        Expected(c, size, i, pairwise, &want, &slack);
        ZERO_RETURN_IF_ERROR(Compare(c, rank, i, result.Get(i), want, slack));
      }
      return absl::OkStatus();
    }
    case CollectiveKind::kAllGather: {
      Buffer send(c.dtype, n, 0, placement), recv(c.dtype, size * n, 0xff, placement);
      const void* source = c.in_place ? recv.at(rank * n) : send.at(0);
      for (int64_t i = 0; i < n; ++i) {
        (c.in_place ? recv : send).Set(c.in_place ? rank * n + i : i, Input(rank, i, c.seed, c.dtype));
      }
      ZERO_RETURN_IF_ERROR(send.Upload());
      ZERO_RETURN_IF_ERROR(recv.Upload());
      ZERO_RETURN_IF_ERROR(comm.AllGather(source, recv.at(0), n, c.dtype)->Wait());
      ZERO_RETURN_IF_ERROR(recv.Download());
      for (int r = 0; r < size; ++r) {
        for (int64_t i = 0; i < n; ++i) {
          ZERO_RETURN_IF_ERROR(Compare(c, rank, r * n + i, recv.Get(r * n + i),
                                       Input(r, i, c.seed, c.dtype), 0));
        }
      }
      return absl::OkStatus();
    }
    case CollectiveKind::kBroadcast: {
      Buffer data(c.dtype, n, 0xff, placement);
      if (rank == c.root) {
        for (int64_t i = 0; i < n; ++i) data.Set(i, Input(rank, i, c.seed, c.dtype));
      }
      ZERO_RETURN_IF_ERROR(data.Upload());
      ZERO_RETURN_IF_ERROR(comm.Broadcast(data.at(0), n, c.dtype, c.root)->Wait());
      ZERO_RETURN_IF_ERROR(data.Download());
      for (int64_t i = 0; i < n; ++i) {
        ZERO_RETURN_IF_ERROR(Compare(c, rank, i, data.Get(i), Input(c.root, i, c.seed, c.dtype), 0));
      }
      return absl::OkStatus();
    }
    case CollectiveKind::kBarrier:
      return comm.Barrier()->Wait();
  }
  return absl::OkStatus();
}

// Integers whose bits a double cannot hold (the suite's other cases compare through doubles):
// 64-bit patterns gathered and their maximum taken, bit for bit, and an odd number of bytes
// broadcast. Host buffers.
Status RunIntegerBitsCase(comm::Communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  auto patterns = [](int r) {
    return std::vector<int64_t>{std::numeric_limits<int64_t>::min() + r, std::numeric_limits<int64_t>::max() - r,
                                static_cast<int64_t>(0x0123456789abcdefull ^ (static_cast<uint64_t>(r) << 60)), -1 - r};
  };
  const std::vector<int64_t> mine = patterns(rank);
  const int64_t n = static_cast<int64_t>(mine.size());
  std::vector<int64_t> gathered(static_cast<size_t>(size * n), 0);
  ZERO_RETURN_IF_ERROR(comm.AllGather(mine.data(), gathered.data(), n, DType::kInt64)->Wait());
  std::vector<int64_t> maximum = mine;
  ZERO_RETURN_IF_ERROR(comm.AllReduce(maximum.data(), maximum.data(), n, DType::kInt64, ReduceOp::kMax)->Wait());
  for (int64_t i = 0; i < n; ++i) {
    int64_t want = std::numeric_limits<int64_t>::min();
    for (int r = 0; r < size; ++r) {
      want = std::max(want, patterns(r)[i]);
      if (gathered[r * n + i] != patterns(r)[i]) {
        return absl::InternalError(absl::StrCat("AllGather(int64) on rank ", rank, ": element ", i, " of rank ", r,
                                                " is ", gathered[r * n + i], ", expected ", patterns(r)[i]));
      }
    }
    if (maximum[i] != want) {
      return absl::InternalError(absl::StrCat("AllReduce(int64, max) on rank ", rank, ": element ", i, " is ",
                                              maximum[i], ", expected ", want));
    }
  }
  const int root = size - 1;
  std::vector<uint8_t> bytes(13, 0xa5);
  if (rank == root) {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 1);
  }
  ZERO_RETURN_IF_ERROR(comm.Broadcast(bytes.data(), static_cast<int64_t>(bytes.size()), DType::kUInt8, root)->Wait());
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != static_cast<uint8_t>(i * 37 + 1)) {
      return absl::InternalError(absl::StrCat("Broadcast(uint8) on rank ", rank, ": byte ", i, " is ",
                                              static_cast<int>(bytes[i])));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Status RunConformanceSuite(comm::Communicator& comm, bool pairwise_rounding, Placement placement) {
  uint64_t seed = 1;
  for (DType dtype : {DType::kFP32, DType::kBF16, DType::kFP16, DType::kInt64, DType::kUInt8}) {
    for (int64_t count : ConformanceSizes()) {
      for (bool in_place : {false, true}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          for (CollectiveKind kind : {CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce}) {
            // The local backend does not reduce integer CUDA buffers (kUnimplemented).
            const bool unsupported = !IsFloatingPoint(dtype) && placement == Placement::kDevice &&
                                     std::string(comm.backend()) == "local";
            if (unsupported) continue;
            ZERO_RETURN_IF_ERROR(
                RunCase(comm, {kind, dtype, op, count, in_place, 0, seed++}, pairwise_rounding, placement));
          }
        }
        ZERO_RETURN_IF_ERROR(RunCase(
            comm, {CollectiveKind::kAllGather, dtype, ReduceOp::kSum, count, in_place, 0, seed++},
            pairwise_rounding, placement));
      }
      const int root = comm.size() - 1;  // not always rank 0
      ZERO_RETURN_IF_ERROR(RunCase(
          comm, {CollectiveKind::kBroadcast, dtype, ReduceOp::kSum, count, false, root, seed++},
          pairwise_rounding, placement));
    }
  }
  if (placement == Placement::kHost) ZERO_RETURN_IF_ERROR(RunIntegerBitsCase(comm));
  return RunCase(comm, {CollectiveKind::kBarrier, DType::kFP32, ReduceOp::kSum, 0, false, 0, 0},
                 pairwise_rounding, placement);
}

}  // namespace zero::testing
