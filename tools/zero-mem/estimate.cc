// Memory formulas.
#include "estimate.h"

#include "absl/strings/str_cat.h"

namespace zero::tools {

StatusOr<StateBytes> BytesPerParam(const std::string& precision, const std::string& optimizer,
                                   const std::string& grad_dtype) {
  // Moment bytes: Adam/AdamW and LAMB keep m and v, SGD (momentum) and Lion one buffer (LAMB's
  // update before its trust ratio, as large as one moment of the shard, counts as workspace).
  double moments;
  if (optimizer == "adam" || optimizer == "adamw" || optimizer == "lamb") {
    moments = 8;
  } else if (optimizer == "sgd" || optimizer == "lion") {
    moments = 4;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer ", optimizer, ": expected adamw, adam, lamb, sgd or lion"));
  }
  StateBytes bytes;
  if (precision == "mixed") {
    bytes = {2, 2, 4 + moments};  // + fp32 master
  } else if (precision == "fp32") {
    bytes = {4, 4, moments};  // the params are the master
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--precision ", precision, ": expected mixed or fp32"));
  }
  if (grad_dtype == "fp32") {
    bytes.grad = 4;
  } else if (!grad_dtype.empty() && !(grad_dtype == "bf16" && precision == "mixed")) {
    return absl::InvalidArgumentError(absl::StrCat("--grad_dtype ", grad_dtype, ": expected ",
                                                   precision == "mixed" ? "bf16 or fp32" : "fp32", " with --precision ",
                                                   precision));
  }
  return bytes;
}

double StageBytes(int stage, double params, int ranks, const StateBytes& b) {
  const double n = ranks;
  switch (stage) {
    case 0: return (b.param + b.grad + b.optimizer) * params;
    case 1: return (b.param + b.grad) * params + b.optimizer * params / n;
    case 2: return b.param * params + (b.grad + b.optimizer) * params / n;
    default: return (b.param + b.grad + b.optimizer) * params / n;
  }
}

double FrozenBytes(int stage, double frozen, int ranks, const StateBytes& b) {
  return stage == 3 ? b.param * frozen / ranks : b.param * frozen;
}

double DeepSpeedZero2Bytes(double params, int ranks) { return 4 * params + 16 * params / ranks; }

double DeepSpeedZero3Bytes(double params, double largest_layer, int ranks) {
  return 4 * largest_layer + 18 * params / ranks;
}

}  // namespace zero::tools
