// Cross-rank agreement: the registry at Finalize, each bucket's collective under
// guard.consistency_check, values every rank must pass alike, and bucket descriptions for
// error messages.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/engine_impl.h"
#include "runtime/replica_hash.h"

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

// All-gathers `words` 64-bit values from every rank (bit patterns, as int64 elements).
Status GatherWords(HostCollectives& host, int world, const std::vector<uint64_t>& mine, std::vector<uint64_t>* all) {
  all->assign(mine.size() * world, 0);
  return host.AllGather(mine.data(), all->data(), static_cast<int64_t>(mine.size()), DType::kInt64);
}

// What a rank registered at one index, as other ranks' messages show it: everything HashSpec
// covers, the defaults (trainable, group 0, no unit) left out. At most kDescriptionBytes.
constexpr size_t kDescriptionWords = 32, kDescriptionBytes = 8 * kDescriptionWords - 1;
constexpr size_t kNameBytes = 160;

// The first `bytes` of `text` or fewer, not splitting a UTF-8 character.
size_t CutAt(const std::string& text, size_t bytes) {
  if (text.size() <= bytes) return text.size();
  while (bytes > 0 && (static_cast<unsigned char>(text[bytes]) & 0xC0) == 0x80) --bytes;
  return bytes;
}

std::string Describe(const ParamSpec& s) {
  const std::string name = s.name.size() <= kNameBytes ? s.name : s.name.substr(0, CutAt(s.name, kNameBytes)) + "…";
  return absl::StrCat("\"", name, "\" [", absl::StrJoin(s.shape, ", "), "] ", DTypeName(s.dtype),
                      s.requires_grad ? "" : " frozen", s.group == 0 ? "" : absl::StrCat(" group ", s.group),
                      s.unit < 0 ? "" : absl::StrCat(" unit ", s.unit));
}

std::string Params(size_t count) { return absl::StrCat(count, count == 1 ? " param" : " params"); }

std::string DescribeIndex(const std::vector<ParamSpec>& specs, size_t index) {
  if (index < specs.size()) return Describe(specs[index]);
  return absl::StrCat("nothing (it registered only ", Params(specs.size()), ")");
}

// Every rank's description, each cut to kDescriptionBytes, in one fixed-size all-gather.
Status GatherDescriptions(HostCollectives& host, int world, const std::string& mine, std::vector<std::string>* all) {
  std::vector<uint64_t> words(kDescriptionWords, 0), gathered;
  std::memcpy(words.data(), mine.data(), CutAt(mine, kDescriptionBytes));
  ZERO_RETURN_IF_ERROR(GatherWords(host, world, words, &gathered));
  all->clear();
  for (int r = 0; r < world; ++r) {
    const char* text = reinterpret_cast<const char*>(gathered.data() + r * kDescriptionWords);
    all->emplace_back(text, strnlen(text, kDescriptionBytes));
  }
  return absl::OkStatus();
}

// "rank 3" or "ranks 0-2, 5".
std::string RankList(const std::vector<int>& ranks) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    runs.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(runs, ", "));
}

// "ranks 0, 2 have X, rank 1 has Y": ranks grouped by what they have, in rank order.
std::string DescribeSides(const std::vector<std::string>& per_rank) {
  std::vector<std::pair<std::string, std::vector<int>>> sides;
  for (int r = 0; r < static_cast<int>(per_rank.size()); ++r) {
    auto side = std::find_if(sides.begin(), sides.end(), [&](const auto& s) { return s.first == per_rank[r]; });
    if (side == sides.end()) side = sides.insert(sides.end(), {per_rank[r], {}});
    side->second.push_back(r);
  }
  std::vector<std::string> parts;
  for (const auto& [what, ranks] : sides) {
    parts.push_back(absl::StrCat(RankList(ranks), ranks.size() == 1 ? " has " : " have ", what));
  }
  return absl::StrJoin(parts, ", ");
}

// The first index at which the ranks' hash lists (`count` words each, 0 past a rank's end)
// differ; `count` if they do not.
size_t FirstDifference(const std::vector<uint64_t>& all, int world, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    for (int r = 1; r < world; ++r) {
      if (all[r * count + i] != all[i]) return i;
    }
  }
  return count;
}

}  // namespace

// What every rank's optimizer step must agree on, as text: the optimizer and each group's
// hyperparameters, clipping, accumulation, the schedule, the loss scale, the gradient dtype.
std::string StepSettings(const Config& c) {
  auto hyper = [](const OptimizerHyper& h) {
    return absl::StrCat("lr ", h.lr, " betas ", h.beta1, "/", h.beta2, " eps ", h.eps, " wd ", h.weight_decay,
                        " momentum ", h.momentum, " dampening ", h.dampening, h.nesterov ? " nesterov" : "");
  };
  std::string text = absl::StrCat(OptimizerTypeName(c.optimizer.type), " ", hyper(c.optimizer));
  for (size_t g = 0; g < c.optimizer.param_groups.size(); ++g) {
    absl::StrAppend(&text, "; group ", g, ": ", hyper(c.optimizer.Group(static_cast<int>(g))));
  }
  const SchedulerConfig& s = c.scheduler;
  absl::StrAppend(&text, "; clip ", c.clip_grad_norm, ", accumulation ", c.gradient_accumulation_steps,
                  ", schedule ", static_cast<int>(s.type), " ", s.warmup_min_lr, "/", s.warmup_max_lr.value_or(-1),
                  "/", s.warmup_num_steps, "/", static_cast<int>(s.warmup_type), "/", s.total_num_steps, "/",
                  s.warmup_min_ratio, "/", s.cos_min_ratio);
  const LossScaleConfig& l = c.loss_scale;
  absl::StrAppend(&text, ", loss scale ", static_cast<int>(l.mode), " ", l.initial_power, "/", l.window, "/",
                  l.hysteresis, "/", l.min, ", gradients ", DTypeName(c.precision.grad));
  return text;
}

// The config keys that shape the collectives each rank makes at its stage (compared once the
// stages agree), with this config's value of each: the bucket layout (stages 0-2; at stage 3 a
// bucket is a unit, whatever the caps), launches, stage 3's gathers, the guard's extra
// collectives (replica checks: stages 0-2, where params are replicas). Ranks that differ in one
// would issue different collectives, or the same ones at other points.
std::vector<std::pair<std::string, std::string>> CollectiveSettings(const Config& c) {
  const BucketConfig& b = c.buckets;
  const Stage3Config& s = c.stage3;
  const GuardConfig& g = c.guard;
  std::vector<std::pair<std::string, std::string>> settings = {
      {"device", c.device == Device::kCuda ? "cuda" : "cpu"},
      {"buckets.overlap", b.overlap ? "true" : "false"},
      {"guard.on_duplicate", g.on_duplicate == DuplicatePolicy::kCount ? "\"count\"" : "\"error\""},
      {"guard.on_unused", g.on_unused == UnusedPolicy::kZero ? "\"zero\"" : "\"error\""},
      {"guard.consistency_check", g.consistency_check ? "true" : "false"},
      {"guard.init_params", g.init_params == InitParams::kVerify ? "\"verify\"" : "\"broadcast\""},
      {"precision.reduce", DTypeName(c.precision.reduce)},
      {"checkpoint.save_frozen", c.checkpoint.save_frozen ? "true" : "false"},
      // Where the host reads the norm, Step also compares the group settings (one more collective).
      {"sync_grad_norm", c.sync_grad_norm ? "true" : "false"},
  };
  if (c.stage == 3) {
    settings.insert(settings.end(), {{"stage3.prefetch_elems", absl::StrCat(s.prefetch_elems)},
                                     {"stage3.max_live_elems", absl::StrCat(s.max_live_elems)},
                                     {"stage3.persistence_threshold", absl::StrCat(s.persistence_threshold)},
                                     {"stage3.max_reuse_elems", absl::StrCat(s.max_reuse_elems)}});
  } else {
    settings.insert(settings.end(), {{"buckets.reduce_bucket_elems", absl::StrCat(b.reduce_bucket_elems)},
                                     {"buckets.first_bucket_elems", absl::StrCat(b.first_bucket_elems)},
                                     {"buckets.last_bucket_elems", absl::StrCat(b.last_bucket_elems)},
                                     {"guard.replica_check_every", absl::StrCat(g.replica_check_every)}});
  }
  return settings;
}

// When the ranks' collective settings differ: one all-gather of every key's hash, then each
// rank's value of the first key that differs; the error names it and both sides.
Status EngineImpl::CollectiveSettingsError() {
  const int world = comm_.size();
  const auto settings = CollectiveSettings(config_);
  std::vector<uint64_t> hashes, all;
  for (const auto& [key, value] : settings) hashes.push_back(Mix(0xcbf29ce484222325ull, value.data(), value.size()));
  ZERO_RETURN_IF_ERROR(GatherWords(host_, world, hashes, &all));
  const size_t first = FirstDifference(all, world, hashes.size());
  if (first == hashes.size()) return absl::InternalError("the ranks' collective settings differ, but no key does");
  std::vector<std::string> sides;
  ZERO_RETURN_IF_ERROR(GatherDescriptions(host_, world, settings[first].second, &sides));
  return absl::InvalidArgumentError(absl::StrCat(
      "ranks use different values of config key ", settings[first].first, ": ", DescribeSides(sides),
      " (this is rank ", comm_.rank(), "). It shapes the collectives every rank makes, which would not match (a "
      "mismatch, or a rank waiting for its peers until guard.timeout_s): every rank must use the same config"));
}

Status EngineImpl::AgreeOnBytes(const void* data, int64_t bytes, const std::string& what) {
  if (comm_.size() == 1) return absl::OkStatus();
  ZERO_ASSIGN_OR_RETURN(uint64_t hash, ReplicaHasher(*ops_, allocator_).Hash(data, bytes));
  std::vector<uint64_t> all(static_cast<size_t>(comm_.size()));
  ZERO_RETURN_IF_ERROR(host_.AllGather(&hash, all.data(), 1, DType::kInt64));
  std::vector<int> others;
  for (int r = 0; r < comm_.size(); ++r) {
    if (all[r] != hash) others.push_back(r);
  }
  if (others.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": the ranks pass different values: rank(s) ",
                                                 absl::StrJoin(others, ", "), " differ from this rank (",
                                                 comm_.rank(), "); every rank passes the same. Nothing was changed"));
}

// One all-gather of (param count, registry hash, stage, step settings' hash, collective
// settings' hash) when the ranks agree. Otherwise every
// rank gets the same gathered values and so takes the same path: the stages, or the first
// differing index (from all hashes) and each rank's param there (one fixed-size all-gather),
// so that any rank's message tells both sides.
Status EngineImpl::CheckRegistryAgrees() {
  const int world = comm_.size(), rank = comm_.rank();
  std::vector<uint64_t> hashes;
  uint64_t total = 0xcbf29ce484222325ull;
  for (const ParamSpec& s : specs_) {
    hashes.push_back(HashSpec(s));
    total = Mix(total, hashes.back());
  }
  const std::string settings = StepSettings(config_);
  const uint64_t settings_hash = Mix(0xcbf29ce484222325ull, settings.data(), settings.size());
  uint64_t collective_hash = 0xcbf29ce484222325ull;
  for (const auto& [key, value] : CollectiveSettings(config_)) {
    collective_hash = Mix(Mix(collective_hash, key.data(), key.size()), value.data(), value.size());
  }
  std::vector<uint64_t> summaries;
  const std::vector<uint64_t> summary = {hashes.size(), total, static_cast<uint64_t>(config_.stage), settings_hash,
                                         collective_hash};
  constexpr size_t kWords = 5;
  ZERO_RETURN_IF_ERROR(GatherWords(host_, world, summary, &summaries));
  bool agree = true, same_stage = true, same_settings = true, same_collectives = true;
  uint64_t most = 0;
  std::vector<std::string> stages;
  for (int r = 0; r < world; ++r) {
    agree &= summaries[kWords * r] == hashes.size() && summaries[kWords * r + 1] == total;
    same_stage &= summaries[kWords * r + 2] == static_cast<uint64_t>(config_.stage);
    same_settings &= summaries[kWords * r + 3] == settings_hash;
    same_collectives &= summaries[kWords * r + 4] == collective_hash;
    most = std::max(most, summaries[kWords * r]);
    stages.push_back(absl::StrCat("stage ", summaries[kWords * r + 2]));
  }
  if (!same_stage) {
    return absl::InvalidArgumentError(absl::StrCat("ranks use different ZeRO stages: ", DescribeSides(stages),
                                                   " (this is rank ", rank, "); every rank must use the same config"));
  }
  if (!same_settings) {  // each rank would step its shard its own way
    std::vector<std::string> sides;
    ZERO_RETURN_IF_ERROR(GatherDescriptions(host_, world, settings, &sides));
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks use different optimizer settings: ", DescribeSides(sides), " (this is rank ", rank,
        "); every rank must use the same optimizer, hyperparameters, clipping, accumulation, schedule and loss "
        "scale (the same config)"));
  }
  if (!same_collectives) return CollectiveSettingsError();
  if (agree) return absl::OkStatus();
  std::vector<uint64_t> padded(most, 0), all;
  std::copy(hashes.begin(), hashes.end(), padded.begin());
  ZERO_RETURN_IF_ERROR(GatherWords(host_, world, padded, &all));
  const size_t first = FirstDifference(all, world, most);
  std::vector<std::string> sides;
  ZERO_RETURN_IF_ERROR(GatherDescriptions(host_, world, DescribeIndex(specs_, first), &sides));
  return absl::InvalidArgumentError(absl::StrCat(
      "ranks registered different params at param index ", first, ": ", DescribeSides(sides), " (this is rank ",
      rank, ", with ", Params(specs_.size()), "). Every rank must register the same params (name, shape, dtype, "
      "trainability, group, unit) in the same order"));
}

Status EngineImpl::CheckRanksAgree(int bucket) {
  if (!diverged_.ok()) return diverged_;  // the ranks no longer meet: no further collectives
  // The layout hash catches buckets that merely happen to have the same size, and ranks that
  // would reduce them in different dtypes (precision.grad differs).
  uint64_t layout = Mix(0xcbf29ce484222325ull, static_cast<int>(plan_->buckets()[bucket].grad_dtype));
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
        " is at bucket ", all[4 * r + 1], " (", all[4 * r + 2], " elements",
        all[4 * r + 3] == layout ? "" : ", other params or gradient dtype",
        ") of iteration ", all[4 * r],
        ". A rank took different control flow (skipped a backward, ran an extra iteration)"));
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
