// Cross-rank agreement: the registry at Finalize, each bucket's collective under
// guard.consistency_check, and bucket descriptions for error messages.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/engine_impl.h"

namespace zero::runtime {
namespace {

// FNV-1a, 64-bit.
uint64_t Mix(uint64_t hash, const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}
template <typename T>
uint64_t Mix(uint64_t hash, const T& value) {
  return Mix(hash, &value, sizeof value);
}

uint64_t HashSpec(const ParamSpec& s) {
  uint64_t h = Mix(0xcbf29ce484222325ull, s.name.data(), s.name.size());
  for (int64_t d : s.shape) h = Mix(h, d);
  h = Mix(h, static_cast<int>(s.dtype));
  h = Mix(h, s.requires_grad);
  h = Mix(h, s.group);
  return Mix(h, s.unit);
}

std::string Describe(const ParamSpec& s) {
  return absl::StrCat("\"", s.name, "\" shape [", absl::StrJoin(s.shape, ", "), "] ", DTypeName(s.dtype),
                      s.requires_grad ? "" : " frozen", " group ", s.group, " unit ", s.unit);
}

// All-gathers `words` 64-bit values from every rank (as raw 16-bit elements).
Status GatherWords(HostCollectives& host, int world, const std::vector<uint64_t>& mine, std::vector<uint64_t>* all) {
  all->assign(mine.size() * world, 0);
  return host.AllGather(mine.data(), all->data(), static_cast<int64_t>(mine.size() * 4), DType::kFP16);
}

}  // namespace

Status EngineImpl::CheckRegistryAgrees() {
  const int world = comm_.size(), rank = comm_.rank();
  std::vector<uint64_t> hashes;
  uint64_t total = Mix(0xcbf29ce484222325ull, config_.stage);
  for (const ParamSpec& s : specs_) {
    hashes.push_back(HashSpec(s));
    total = Mix(total, hashes.back());
  }
  std::vector<uint64_t> summaries;
  ZERO_RETURN_IF_ERROR(GatherWords(host_, world, {hashes.size(), total}, &summaries));
  bool agree = true;
  uint64_t most = 0;
  for (int r = 0; r < world; ++r) {
    agree &= summaries[2 * r] == hashes.size() && summaries[2 * r + 1] == total;
    most = std::max(most, summaries[2 * r]);
  }
  if (agree) return absl::OkStatus();
  // Find the first index at which some rank differs from this one.
  std::vector<uint64_t> padded(most, 0), all;
  std::copy(hashes.begin(), hashes.end(), padded.begin());
  ZERO_RETURN_IF_ERROR(GatherWords(host_, world, padded, &all));
  size_t first = most;
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < most; ++i) {
      if (all[r * most + i] == padded[i]) continue;
      if (i < first) {
        first = i;
        ranks.clear();
      }
      if (i == first) ranks.push_back(r);
      break;
    }
  }
  if (first == most) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks registered the same params but use different stages (this rank: stage ", config_.stage,
        "); every rank must use the same config"));
  }
  const std::string mine = first < specs_.size() ? Describe(specs_[first]) : std::string("nothing (it has fewer params)");
  return absl::InvalidArgumentError(absl::StrCat(
      "ranks registered different params: param index ", first, " on rank ", rank, " is ", mine,
      ", but rank(s) ", absl::StrJoin(ranks, ", "), " registered something else there (another name, "
      "shape, dtype, trainability, group or unit; rank ", rank, " has ", specs_.size(),
      " params). Every rank must register the same params in the same order; see each rank's "
      "message for its side"));
}

Status EngineImpl::CheckRanksAgree(int bucket) {
  if (!diverged_.ok()) return diverged_;  // the ranks no longer meet: no further collectives
  // The layout hash catches buckets that merely happen to have the same size.
  uint64_t layout = 0xcbf29ce484222325ull;
  for (int p : plan_->buckets()[bucket].params) {
    layout = Mix(layout, p);
    layout = Mix(layout, plan_->placement(p).offset);
  }
  const std::vector<uint64_t> mine = {static_cast<uint64_t>(iteration_), static_cast<uint64_t>(bucket),
                                      static_cast<uint64_t>(plan_->buckets()[bucket].numel), layout};
  std::vector<uint64_t> all;
  ZERO_RETURN_IF_ERROR(GatherWords(host_, comm_.size(), mine, &all));
  for (int r = 0; r < comm_.size(); ++r) {
    if (std::equal(mine.begin(), mine.end(), all.begin() + 4 * r)) continue;
    diverged_ = absl::FailedPreconditionError(absl::StrCat(
        "ranks diverged (guard.consistency_check): rank ", comm_.rank(), " is about to reduce ",
        DescribeBucket(bucket), ", ", mine[2], " elements, of iteration ", iteration_, ", but rank ", r,
        " is at bucket ", all[4 * r + 1], " (", all[4 * r + 2], " elements", all[4 * r + 3] == layout ? "" : ", other params",
        ") of iteration ", all[4 * r],
        ". A rank took different control flow (skipped a backward, ran an extra iteration) or "
        "uses a different config (bucket sizes)"));
    return diverged_;
  }
  return absl::OkStatus();
}

std::string EngineImpl::DescribeBucket(int bucket) const {
  const auto& params = plan_->buckets()[bucket].params;
  std::vector<std::string> names;
  for (size_t i = 0; i < params.size() && i < 6; ++i) names.push_back(ParamLabel(params[i]));
  return absl::StrCat("bucket ", bucket, " (params ", absl::StrJoin(names, ", "), params.size() > 6 ? ", …" : "", ")");
}

}  // namespace zero::runtime
