// bf16/fp16 reductions as user MPI_Ops: inout[i] = round(in[i] ∘ inout[i]) computed in fp32.
#include "comm/mpi/mpi_ops.h"

#include <algorithm>

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

}  // namespace

Status HalfPrecisionOps::Create() {
  ZERO_MPI_RETURN_IF_ERROR(MPI_Op_create(&Combine<Bf16ToFloat, FloatToBf16, false>, 1, &ops_[0][0]));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Op_create(&Combine<Bf16ToFloat, FloatToBf16, true>, 1, &ops_[0][1]));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Op_create(&Combine<HalfToFloat, FloatToHalf, false>, 1, &ops_[1][0]));
  ZERO_MPI_RETURN_IF_ERROR(MPI_Op_create(&Combine<HalfToFloat, FloatToHalf, true>, 1, &ops_[1][1]));
  return absl::OkStatus();
}

void HalfPrecisionOps::Free() {
  for (auto& row : ops_) {
    for (MPI_Op& op : row) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    }
  }
}

MPI_Op HalfPrecisionOps::Get(DType dtype, ReduceOp op) const {
  return ops_[dtype == DType::kFP16 ? 1 : 0][op == ReduceOp::kMax ? 1 : 0];
}

}  // namespace zero::comm
