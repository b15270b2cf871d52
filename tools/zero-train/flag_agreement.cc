// The trainer-flag comparison of zero-train (flag_agreement.h): one all-gather of every
// flag as a number, then the first flag that differs named with each rank's value.
#include "flag_agreement.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zero::tools {

int64_t TextFingerprint(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return static_cast<int64_t>(hash);
}

Status AgreeOnTrainerFlags(comm::Communicator& comm, const std::vector<ComparedFlag>& flags, double timeout_s) {
  const int64_t count = static_cast<int64_t>(flags.size());
  std::vector<int64_t> mine, all(flags.size() * comm.size());
  for (const ComparedFlag& flag : flags) mine.push_back(flag.second);
  ZERO_RETURN_IF_ERROR(
      comm.AllGather(mine.data(), all.data(), count, DType::kInt64, comm::kTrainerValuesTag)->Wait(timeout_s));
  for (int64_t f = 0; f < count; ++f) {
    std::vector<std::string> values;
    bool differ = false;
    for (int r = 0; r < comm.size(); ++r) {
      const int64_t value = all[r * count + f];
      differ = differ || value != all[f];
      values.push_back(absl::StrCat("rank ", r, ": ", value));
    }
    if (!differ) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "the ranks run with different --", flags[f].first, " (", absl::StrJoin(values, ", "),
        "); every rank of a job needs the same trainer flags (a text flag shows as its fingerprint)"));
  }
  return absl::OkStatus();
}

}  // namespace zero::tools
