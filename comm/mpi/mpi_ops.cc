// User MPI_Ops: bf16/fp16 inout[i] = round(in[i] ∘ inout[i]) computed in fp32; uint8 sums
// modulo 256.
#include "comm/mpi/mpi_ops.h"

#include <algorithm>
#include <cstdint>

#include "base/status_converters.h"

namespace zero::comm {
namespace {

template <float (*Load)(uint16_t), uint16_t (*Store)(float), bool kMax>
void Combine(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = Load(a[i]), y = Load(b[i]);
    b[i] = Store(kMax ? std::max(x, y) : x + y);
  }
}

void WrappingByteSum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint8_t* a = static_cast<const uint8_t*>(in);
  uint8_t* b = static_cast<uint8_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<uint8_t>(a[i] + b[i]);
}

}  // namespace

Status UserOps::Create() {
  ZERO_MPI_RETURN_IF_ERROR(MPI_Op_create(&Combine<Bf16ToFloat, FloatToBf16, false>, 1, &half_[0][0]));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Op_create(&Combine<Bf16ToFloat, FloatToBf16, true>, 1, &half_[0][1]));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Op_create(&Combine<HalfToFloat, FloatToHalf, false>, 1, &half_[1][0]));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Op_create(&Combine<HalfToFloat, FloatToHalf, true>, 1, &half_[1][1]));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Op_create(&WrappingByteSum, 1, &uint8_sum_));
  return absl::OkStatus();
}

void UserOps::Free() {
  for (auto& row : half_) {
    for (MPI_Op& op : row) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    }
  }
  if (uint8_sum_ != MPI_OP_NULL) MPI_Op_free(&uint8_sum_);
}

MPI_Op UserOps::Get(DType dtype, ReduceOp op) const {
  const int which = op == ReduceOp::kMax ? 1 : 0;
  switch (dtype) {
    case DType::kBF16: return half_[0][which];
    case DType::kFP16: return half_[1][which];
    case DType::kUInt8: return op == ReduceOp::kSum ? uint8_sum_ : MPI_MAX;
    case DType::kFP32:
    case DType::kInt64: break;
  }
  return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
}

}  // namespace zero::comm
