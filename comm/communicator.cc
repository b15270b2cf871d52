// Signatures, completed works and shared argument checks.
#include "zero/communicator.h"

#include "absl/strings/str_cat.h"

namespace zero::comm {
namespace {

const char* KindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kReduceScatter: return "ReduceScatter";
    case CollectiveKind::kAllGather: return "AllGather";
    case CollectiveKind::kAllReduce: return "AllReduce";
    case CollectiveKind::kBroadcast: return "Broadcast";
    case CollectiveKind::kBarrier: return "Barrier";
  }
  return "?";
}

class DoneWork final : public Work {
 public:
  explicit DoneWork(Status status) : status_(std::move(status)) {}
  Status Wait(double) override { return status_; }
  bool Test() override { return true; }
  Status WaitOnStream(void*, double) override { return status_; }  // nothing to wait for

 private:
  Status status_;
};

}  // namespace

bool CollectiveSignature::operator==(const CollectiveSignature& o) const {
  return kind == o.kind && count == o.count && dtype == o.dtype && op == o.op && root == o.root && tag == o.tag;
}

std::string CollectiveSignature::ToString() const {
  std::string tagged;  // ", tag=4", ", host values", ", trainer values"
  if (tag == kHostValuesTag) {
    tagged = ", host values";
  } else if (tag == kTrainerValuesTag) {
    tagged = ", trainer values";
  } else if (tag >= 0) {
    tagged = absl::StrCat(", tag=", tag);
  }
  switch (kind) {
    case CollectiveKind::kBarrier:
      return "Barrier()";
    case CollectiveKind::kBroadcast:
      return absl::StrCat("Broadcast(count=", count, ", ", DTypeName(dtype), ", root=", root, tagged, ")");
    case CollectiveKind::kAllGather:
      return absl::StrCat("AllGather(count=", count, ", ", DTypeName(dtype), tagged, ")");
    default:
      return absl::StrCat(KindName(kind), "(count=", count, ", ", DTypeName(dtype), ", ",
                          op == ReduceOp::kSum ? "sum" : "max", tagged, ")");
  }
}

WorkPtr CompletedWork(Status status) { return std::make_unique<DoneWork>(std::move(status)); }

Status ValidateCollective(const CollectiveSignature& s, const void* a, const void* b, int size) {
  if (s.count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(s.ToString(), ": negative count"));
  }
  if (s.kind != CollectiveKind::kBarrier && s.count > 0 && (a == nullptr || b == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(s.ToString(), ": null buffer"));
  }
  if (s.kind == CollectiveKind::kBroadcast && (s.root < 0 || s.root >= size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.ToString(), ": root ", s.root, " is not a rank of a group of ", size));
  }
  return absl::OkStatus();
}

}  // namespace zero::comm
