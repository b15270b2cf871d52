// Offline resharding: a checkpoint's records rewritten as the rank files a job at another
// world size would write, one new rank at a time, without building engines.
//
// Each new rank's file holds the parts of every trainable param that rank owns in the layout
// an engine builds at stage 1 with the default bucket sizes (the records of stages 1-3 have the
// same layout; meta.json's stage is informative, and a load at any stage and bucket size reads
// whatever records overlap what it owns). Values come from the old records that overlap each
// part; the last record read is kept, so consecutive parts that fall in one old record read it
// once. Memory: the old files' indexes, one old record and one new part; no threads.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "partition/partition_plan.h"
#include "runtime/checkpoint_files.h"
#include "runtime/checkpoint_format.h"
#include "zero/checkpoint.h"
#include "zero/config.h"

namespace zero {
namespace {

using runtime::CheckpointMeta;
using runtime::RankFileReader;
using runtime::RecordExtent;

// The old checkpoint's records, read through a one-record cache.
class OldRecords {
 public:
  OldRecords(std::vector<std::unique_ptr<RankFileReader>> readers, int moments, size_t params)
      : readers_(std::move(readers)), moments_(moments), of_param_(params) {
    for (size_t q = 0; q < readers_.size(); ++q) {
      const std::vector<RankFileReader::Record>& records = readers_[q]->records();
      for (size_t k = 0; k < records.size(); ++k) of_param_[records[k].param].emplace_back(q, k);
    }
  }

  // Fills part [begin, begin + numel) of `param` (values laid out as a record: numel weights,
  // then numel of each moment) from every old record that overlaps it; kDataLoss when some
  // element is in none.
  Status Fill(int param, int64_t begin, int64_t numel, std::vector<float>* part) {
    part->assign(static_cast<size_t>(numel * (1 + moments_)), 0.0f);
    int64_t covered = 0;
    for (const auto& [q, k] : of_param_[param]) {
      const RankFileReader::Record& r = readers_[q]->records()[k];
      const int64_t first = std::max(begin, r.begin), last = std::min(begin + numel, r.begin + r.numel);
      if (first >= last) continue;
      ZERO_RETURN_IF_ERROR(Load(q, k));
      for (int plane = 0; plane <= moments_; ++plane) {
        std::copy_n(values_.data() + plane * r.numel + (first - r.begin), last - first,
                    part->data() + plane * numel + (first - begin));
      }
      covered += last - first;
    }
    if (covered != numel) {
      return absl::DataLossError(absl::StrCat("checkpoint: elements [", begin, ", ", begin + numel, ") of param ",
                                              param, " are covered ", covered, " times over, not once"));
    }
    return absl::OkStatus();
  }

 private:
  Status Load(size_t q, size_t k) {
    if (q == loaded_q_ && k == loaded_k_) return absl::OkStatus();
    loaded_q_ = loaded_k_ = SIZE_MAX;
    ZERO_RETURN_IF_ERROR(readers_[q]->Read(k, &values_));
    loaded_q_ = q;
    loaded_k_ = k;
    return absl::OkStatus();
  }

  std::vector<std::unique_ptr<RankFileReader>> readers_;
  int moments_;
  std::vector<std::vector<std::pair<size_t, size_t>>> of_param_;  // (file, record) per param
  std::vector<float> values_;
  size_t loaded_q_ = SIZE_MAX, loaded_k_ = SIZE_MAX;
};

// The parts of each trainable param that `rank` owns in `plan`, in param coordinates.
std::vector<RecordExtent> OwnedParts(const partition::PartitionPlan& plan, int rank) {
  std::vector<RecordExtent> parts;
  for (size_t p = 0; p < plan.params().size(); ++p) {
    if (!plan.params()[p].requires_grad) continue;
    const auto& place = plan.placement(static_cast<int>(p));
    const partition::OwnedSpan owned = plan.Owned(place.bucket, rank);
    const int64_t first = std::max(place.offset, owned.begin);
    const int64_t last = std::min(place.offset + place.numel, owned.begin + owned.numel);
    if (first < last) parts.push_back({static_cast<int32_t>(p), first - place.offset, last - first});
  }
  return parts;
}

}  // namespace

Status ReshardCheckpoint(const std::string& target, int world, const std::string& out) {
  if (world < 1 || world > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("reshard: world ", world, " is not in [1, 1048576]"));
  }
  ZERO_ASSIGN_OR_RETURN(const std::string dir, runtime::ResolveCheckpointDir(target));
  ZERO_ASSIGN_OR_RETURN(CheckpointMeta meta, runtime::ReadCheckpointMeta(dir));
  std::vector<std::unique_ptr<RankFileReader>> readers;
  for (int q = 0; q < meta.world; ++q) {
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<RankFileReader> reader,
                          RankFileReader::Open(runtime::RankFilePath(dir, q, meta.world), meta));
    readers.push_back(std::move(reader));
  }
  OldRecords old(std::move(readers), meta.moments, meta.params.size());

  std::vector<partition::ParamInfo> infos;
  for (const CheckpointMeta::Param& p : meta.params) {
    ZERO_ASSIGN_OR_RETURN(const DType dtype, ParseDType(p.dtype));
    infos.push_back({p.name, p.numel, dtype, p.requires_grad, 0, -1});
  }
  const Config defaults;
  partition::PlanConfig layout;
  layout.world_size = world;
  layout.stage = 1;
  layout.grad = defaults.precision.grad;
  layout.reduce_bucket_elems = defaults.buckets.reduce_bucket_elems;
  layout.first_bucket_elems = defaults.buckets.first_bucket_elems;
  layout.last_bucket_elems = defaults.buckets.last_bucket_elems;
  ZERO_ASSIGN_OR_RETURN(const partition::PartitionPlan plan, partition::PartitionPlan::Build(infos, layout));

  const std::string destination = runtime::TrimmedDir(out);
  const std::string partial = destination + ".partial";
  std::error_code error;
  std::filesystem::remove_all(partial, error);
  std::filesystem::create_directories(partial, error);
  if (error) return absl::UnavailableError(absl::StrCat("reshard: cannot create ", partial, ": ", error.message()));
  std::vector<float> part;
  for (int rank = 0; rank < world; ++rank) {
    const std::vector<RecordExtent> parts = OwnedParts(plan, rank);
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<runtime::RankFileWriter> writer,
                          runtime::RankFileWriter::Create(runtime::RankFilePath(partial, rank, world), parts,
                                                          meta.moments));
    for (const RecordExtent& e : parts) {
      ZERO_RETURN_IF_ERROR(old.Fill(e.param, e.begin, e.numel, &part));
      ZERO_RETURN_IF_ERROR(writer->Append(part.data()));
    }
    ZERO_RETURN_IF_ERROR(writer->Close());
  }
  meta.format = runtime::kCheckpointFormat;
  meta.world = world;
  meta.stage = 1;
  ZERO_RETURN_IF_ERROR(runtime::WriteFileDurably(partial + "/meta.json", runtime::CheckpointMetaJson(meta)));
  return runtime::PublishDirectory(partial, destination);
}

}  // namespace zero
