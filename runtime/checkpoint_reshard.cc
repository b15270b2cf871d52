// Offline resharding: a checkpoint's records rewritten as the rank files a job at another
// world size would write, one new rank at a time, without building engines.
//
// Each new rank's file holds the parts of every saved param (trainable params, and frozen ones
// saved with checkpoint.save_frozen, as weights alone) that rank owns in the layout
// an engine builds at stage 1 with the default bucket sizes (the records of stages 1-3 have the
// same layout; meta.json's stage is informative, and a load at any stage and bucket size reads
// whatever records overlap what it owns). Values come from the old records that overlap each
// part; the last record read is kept, so consecutive parts that fall in one old record read it
// once. Memory: the old files' indexes, one old record and one new part; one file open at a
// time; no threads.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "partition/partition_plan.h"
#include "runtime/checkpoint_files.h"
#include "runtime/checkpoint_format.h"
#include "runtime/checkpoint_series.h"
#include "zero/checkpoint.h"
#include "zero/config.h"

namespace zero {
namespace {

using runtime::CheckpointMeta;
using runtime::RankFileReader;
using runtime::RecordExtent;

// The old checkpoint's records, read through a one-record cache. Only the indexes are kept;
// a file is opened when one of its records is read (one open at a time), so a checkpoint of
// any world size is read within the process's file limit.
class OldRecords {
 public:
  // Reads every rank file's index of checkpoint `dir`.
  static StatusOr<std::unique_ptr<OldRecords>> Open(const std::string& dir, const CheckpointMeta& meta) {
    std::unique_ptr<OldRecords> old(new OldRecords(dir, meta));
    for (int q = 0; q < meta.world; ++q) {
      ZERO_ASSIGN_OR_RETURN(std::unique_ptr<RankFileReader> reader, RankFileReader::Open(old->Path(q), meta, q));
      const std::vector<RankFileReader::Record>& records = reader->records();
      for (size_t k = 0; k < records.size(); ++k) old->of_param_[records[k].param].push_back({q, k, records[k]});
    }
    return old;
  }

  // Fills part `e` of a param (values laid out as a record: numel weights, then numel of each
  // moment unless weights_only) from the old records that overlap it; kDataLoss unless they
  // cover it exactly once (CheckTiling, as a load checks).
  Status Fill(const RecordExtent& e, std::vector<float>* part) {
    const int param = e.param;
    const int64_t begin = e.begin, numel = e.numel, end = begin + numel;
    const int moments = e.weights_only ? 0 : meta_.moments;
    part->assign(static_cast<size_t>(runtime::PayloadFloats(e, meta_.moments)), 0.0f);
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (const Located& located : of_param_[param]) {
      const RankFileReader::Record& r = located.record;
      const int64_t first = std::max(begin, r.begin), last = std::min(end, r.begin + r.numel);
      if (first >= last) continue;
      ZERO_RETURN_IF_ERROR(Load(located));
      for (int plane = 0; plane <= moments; ++plane) {
        std::copy_n(values_.data() + plane * r.numel + (first - r.begin), last - first,
                    part->data() + plane * numel + (first - begin));
      }
      spans.emplace_back(first, last);
    }
    return runtime::CheckTiling(std::move(spans), begin, end,
                                absl::StrCat("param \"", meta_.params[param].name, "\""));
  }

 private:
  struct Located {
    int file;
    size_t index;
    RankFileReader::Record record;
  };
  OldRecords(std::string dir, const CheckpointMeta& meta)
      : dir_(std::move(dir)), meta_(meta), of_param_(meta.params.size()) {}
  std::string Path(int q) const { return runtime::RankFilePath(dir_, q, meta_.world); }

  Status Load(const Located& located) {
    if (located.file == loaded_file_ && located.index == loaded_index_) return absl::OkStatus();
    loaded_index_ = SIZE_MAX;
    if (located.file != open_file_) {
      reader_.reset();
      open_file_ = -1;
      ZERO_ASSIGN_OR_RETURN(reader_, RankFileReader::Open(Path(located.file), meta_, located.file));
      open_file_ = located.file;
    }
    ZERO_RETURN_IF_ERROR(reader_->Read(located.index, &values_));
    loaded_file_ = located.file;
    loaded_index_ = located.index;
    return absl::OkStatus();
  }

  const std::string dir_;
  const CheckpointMeta& meta_;
  std::vector<std::vector<Located>> of_param_;
  std::unique_ptr<RankFileReader> reader_;  // the one open file
  int open_file_ = -1;
  std::vector<float> values_;  // the last record read
  int loaded_file_ = -1;
  size_t loaded_index_ = SIZE_MAX;
};

// Whether one of two directories is the other or inside it (absolute, symlinks resolved).
bool Nested(const std::string& a, const std::string& b) {
  std::error_code error;
  const std::filesystem::path x = std::filesystem::weakly_canonical(a, error);
  const std::filesystem::path y = std::filesystem::weakly_canonical(b, error);
  if (error) return false;
  auto starts_with = [](const std::filesystem::path& whole, const std::filesystem::path& prefix) {
    return std::mismatch(prefix.begin(), prefix.end(), whole.begin(), whole.end()).first == prefix.end();
  };
  return starts_with(x, y) || starts_with(y, x);
}

// The parts of each saved param that `rank` owns in `plan`, in param coordinates.
std::vector<RecordExtent> OwnedParts(const partition::PartitionPlan& plan, const CheckpointMeta& meta, int rank) {
  std::vector<RecordExtent> parts;
  for (const partition::Fragment& f : plan.FragmentsOnRank(rank)) {
    const bool trainable = plan.params()[f.param].requires_grad;
    if (meta.params[f.param].saved) parts.push_back({f.param, f.param_begin, f.numel, /*weights_only=*/!trainable});
  }
  return parts;
}

}  // namespace

Status ReshardCheckpoint(const std::string& target, int world, const std::string& out) {
  if (world < 1 || world > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("reshard: world ", world, " is not in [1, 1048576]"));
  }
  ZERO_ASSIGN_OR_RETURN(const std::string dir, runtime::ResolveCheckpointDir(target));
  if (Nested(dir, out) || Nested(runtime::TrimmedDir(target), out)) {
    return absl::InvalidArgumentError(absl::StrCat("reshard: ", out, " and the checkpoint ", dir,
                                                   " are one inside the other; publishing there would replace the "
                                                   "input: write the new checkpoint elsewhere"));
  }
  ZERO_ASSIGN_OR_RETURN(CheckpointMeta meta, runtime::ReadCheckpointMeta(dir));
  ZERO_ASSIGN_OR_RETURN(std::unique_ptr<OldRecords> old, OldRecords::Open(dir, meta));

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
  ZERO_RETURN_IF_ERROR(runtime::RefuseToReplaceOtherData(destination, "reshard"));
  const std::string partial = destination + ".partial";
  std::error_code error;
  std::filesystem::remove_all(partial, error);
  std::filesystem::create_directories(partial, error);
  if (error) return absl::UnavailableError(absl::StrCat("reshard: cannot create ", partial, ": ", error.message()));
  std::vector<float> part;
  std::vector<uint64_t> rank_files;  // the new files' (meta, read through `old`, names the old ones)
  for (int rank = 0; rank < world; ++rank) {
    const std::vector<RecordExtent> parts = OwnedParts(plan, meta, rank);
    ZERO_ASSIGN_OR_RETURN(std::unique_ptr<runtime::RankFileWriter> writer,
                          runtime::RankFileWriter::Create(runtime::RankFilePath(partial, rank, world), parts,
                                                          meta.moments));
    for (const RecordExtent& e : parts) {
      ZERO_RETURN_IF_ERROR(old->Fill(e, &part));
      ZERO_RETURN_IF_ERROR(writer->Append(part.data()));
    }
    ZERO_RETURN_IF_ERROR(writer->Close());
    rank_files.push_back(writer->index_checksum());
  }
  meta.format = runtime::FormatFor(meta);
  meta.world = world;
  meta.rank_files = std::move(rank_files);
  meta.stage = 1;
  ZERO_ASSIGN_OR_RETURN(const std::string text, runtime::CheckpointMetaJson(meta));
  ZERO_RETURN_IF_ERROR(runtime::WriteFileDurably(partial + "/meta.json", text));
  return runtime::PublishDirectory(partial, destination);
}

}  // namespace zero
