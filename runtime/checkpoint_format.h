// The on-disk format of a checkpoint (internal to runtime): meta.json, and one rank file per
// saving rank that starts with an index of its records, so that a loading rank reads only the
// records that overlap what it owns, each checked against its own checksum.
//
//   DIR/meta.json        format, world, stage, step, optimizer, moment count, loss scaler,
//                        the trainer's user_data, each optimizer group's hyperparameters,
//                        each param's name, shape, dtype, requires_grad, whether it has
//                        records (saved) and own step count, and each rank file's index
//                        checksum (rank 0 writes it; the lr schedule's position is the
//                        step - 1)
//   DIR/rank-R-of-N.bin  format 3:
//       "ZRTCKPT3", int64 record count n,
//       n index entries {int32 param, int32 0, int64 begin, int64 numel, uint64 offset,
//                        uint64 XXH3-64 of the record's payload},
//       uint64 XXH3-64 of everything before it (the header),
//       then the records' payloads back to back, each at its offset: `numel` fp32 weights of
//       elements [begin, begin + numel) of the param, then `numel` values of each moment (a
//       frozen param's record, written under checkpoint.save_frozen into a checkpoint of
//       format 5, holds the weights alone).
//   Format 2 ("ZRTCKPT2": records {int32 param, int64 begin, int64 numel, payload} in line,
//   then the record count and the XXH3-64 of the whole file) and format 1 ("ZRTCKPT1", the
//   count after the magic, no checksum) still load; their index is built by a scan.
#ifndef ZERO_RUNTIME_CHECKPOINT_FORMAT_H_
#define ZERO_RUNTIME_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/loss_scaler.h"
#include "zero/config.h"
#include "zero/status.h"

namespace zero::runtime {

/// The format SaveCheckpoint writes: 4 is format 3's rank files with a checksum in meta.json
/// (its "checksum" field: the XXH3-64, in hex, of the JSON of every other field), required
/// from format 4 on, so that no damaged byte of meta.json loads.
inline constexpr int kCheckpointFormat = 4;
/// Format 5: format 4 with frozen params saved (checkpoint.save_frozen: "saved" params that
/// are not trainable, whose records hold weights alone). Written only by such saves, so that
/// a reader of formats up to 4 refuses it as too new instead of misreading those records.
inline constexpr int kCheckpointFormatWithFrozen = 5;

/// meta.json.
struct CheckpointMeta {
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    std::string dtype;
    bool requires_grad = true;
    /// Whether rank files hold its values: every trainable param; a frozen one only when
    /// saved with checkpoint.save_frozen (its records then hold weights, no moments). In
    /// meta.json from the first files that saved frozen params; absent: requires_grad.
    bool saved = true;
    int64_t numel = 0;
    /// Optimizer steps that updated this param (bias correction); the checkpoint's step when
    /// the file has none.
    int64_t steps = 0;
    /// A trainable param's optimizer group (ParamSpec::group); -1 for a frozen one and in files
    /// written before it was recorded (then not checked at a load).
    int group = -1;
    /// Other names of the same param (Engine::AddParamAlias: a tied weight's); in meta.json
    /// only where there are some.
    std::vector<std::string> aliases;
  };
  int format = kCheckpointFormat;
  int world = 0;
  int stage = 0;
  int moments = 0;
  int64_t step = 0;
  /// Order of the save within its series (SaveCheckpoint(root, tag)): 1 + the largest of the
  /// series' checkpoints when it was written, so the newest saves are known after a rollback;
  /// 0 outside a series and in files written before it was recorded.
  int64_t series_seq = 0;
  std::string optimizer;
  LossScaler::State scaler{};
  std::string user_data;
  /// Each optimizer group's hyperparameters for the next step; empty in files written before
  /// groups were saved (the config's then apply).
  std::vector<OptimizerHyper> groups;
  std::vector<Param> params;
  /// Each rank file's index checksum (the XXH3-64 stored at the end of its index, which covers
  /// every record's checksum), by rank: a rank file from another save is refused. Empty in
  /// files written before it was recorded (their rank files are not matched to the save).
  std::vector<uint64_t> rank_files;
};

/// The format a checkpoint of `meta`'s params is written in: kCheckpointFormatWithFrozen when
/// it saves a frozen param, else kCheckpointFormat.
int FormatFor(const CheckpointMeta& meta);

/// Reads DIR/meta.json, checks its checksum (kDataLoss; format 4 on) and every field's type and
/// range (step ≥ 0, the loss scale finite, > 0 and ≤ 2^64, ...): kInvalidArgument names the
/// file and the field; kNotFound when DIR is missing (saying so when only DIR.partial, an
/// unfinished save, is there); kUnavailable when it cannot be read.
StatusOr<CheckpointMeta> ReadCheckpointMeta(const std::string& dir);
/// meta.json's text; kInvalidArgument when a string in it (a param name, the user data) is
/// not UTF-8, which JSON cannot hold.
StatusOr<std::string> CheckpointMetaJson(const CheckpointMeta& meta);
/// kInvalidArgument naming `what` when `text` (a param name, the trainer's user data) is not
/// UTF-8, which meta.json cannot hold, or holds a NUL byte, where a C caller's copy would end:
/// checked where it is given, not first at a save.
Status CheckMetaText(std::string_view text, std::string_view what);

/// `dir` without trailing slashes.
std::string TrimmedDir(std::string dir);
/// DIR/rank-R-of-N.bin
std::string RankFilePath(const std::string& dir, int rank, int world);

/// kDataLoss unless the (begin, end) spans tile [begin, end) exactly: no element missing (in
/// no rank file), none twice (rank files of different saves). `what` names the param.
Status CheckTiling(std::vector<std::pair<int64_t, int64_t>> spans, int64_t begin, int64_t end,
                   const std::string& what);

/// Which elements of which param a record holds.
struct RecordExtent {
  int32_t param = 0;
  int64_t begin = 0;
  int64_t numel = 0;
  /// A frozen param's record: the weights alone, no moments.
  bool weights_only = false;
};

/// Floats in the payload of a record `e` of a checkpoint whose optimizer keeps `moments`.
inline int64_t PayloadFloats(const RecordExtent& e, int moments) {
  return e.numel * (e.weights_only ? 1 : 1 + moments);
}

/// Writes a rank file of format 3: the records are announced first (their index), then
/// appended in that order, so no more than one record is held in memory.
class RankFileWriter {
 public:
  /// Creates (truncates) `path` for `records`, each PayloadFloats(record, moments) floats.
  static StatusOr<std::unique_ptr<RankFileWriter>> Create(const std::string& path,
                                                          std::vector<RecordExtent> records,
                                                          int moments);
  ~RankFileWriter();
  RankFileWriter(const RankFileWriter&) = delete;
  RankFileWriter& operator=(const RankFileWriter&) = delete;

  /// Appends the next record's payload: weights, then each moment unless weights_only (numel
  /// floats each).
  Status Append(const float* values);
  /// Writes the index with every record's checksum, syncs the file to disk and closes it.
  /// kFailedPrecondition when fewer records were appended than announced.
  Status Close();
  /// The index's checksum Close() wrote (CheckpointMeta::rank_files); 0 before.
  uint64_t index_checksum() const { return index_checksum_; }

 private:
  RankFileWriter(int fd, std::string path, std::vector<RecordExtent> records, int moments);
  int fd_;
  std::string path_;
  std::vector<RecordExtent> records_;
  std::vector<uint64_t> checksums_;
  int moments_;
  uint64_t index_checksum_ = 0;
};

/// Reads one rank file of any format, record by record.
class RankFileReader {
 public:
  /// A record in the file: its extent, where its payload starts, and the XXH3-64 of the
  /// payload (format 3; formats 1 and 2 have none per record).
  struct Record : RecordExtent {
    uint64_t offset = 0;
    uint64_t checksum = 0;
  };

  /// Opens `path`, rank `rank`'s file of the checkpoint described by `meta`, and reads its
  /// index (format 2: checks the whole file's checksum first; format 1: scans it). Every
  /// record must be of a saved param, lie inside it (`meta`'s shapes) and inside the file; a
  /// frozen param's records are weights_only. kDataLoss names the file for damage (checksums,
  /// truncation) and for a file of another save (its index checksum is not meta.rank_files'
  /// for `rank`); kInvalidArgument for a file that is not a rank file.
  static StatusOr<std::unique_ptr<RankFileReader>> Open(const std::string& path, const CheckpointMeta& meta,
                                                        int rank);
  ~RankFileReader();
  RankFileReader(const RankFileReader&) = delete;
  RankFileReader& operator=(const RankFileReader&) = delete;

  int format() const { return format_; }
  const std::vector<Record>& records() const { return records_; }
  /// Reads record `k`'s payload (PayloadFloats floats) and checks its checksum.
  Status Read(size_t k, std::vector<float>* values);
  /// Bytes read from the file so far (index, payloads, and the whole file for format 2).
  int64_t bytes_read() const { return bytes_read_; }
  /// The file's size.
  int64_t file_bytes() const { return file_bytes_; }

 private:
  RankFileReader(int fd, std::string path, int moments, int64_t file_bytes)
      : fd_(fd), path_(std::move(path)), moments_(moments), file_bytes_(file_bytes) {}
  // Reads exactly `bytes` at `offset`; kDataLoss if the file ends first.
  Status ReadAt(void* out, int64_t bytes, int64_t offset);
  Status ReadIndex(const CheckpointMeta& meta);
  // kDataLoss unless the index checksum is the one `meta` recorded for `rank` (if any).
  Status CheckSameSave(const CheckpointMeta& meta, int rank) const;
  Status ScanLegacy(const CheckpointMeta& meta);
  // Checks where record `k` lies and marks a frozen param's record weights_only.
  Status CheckExtent(RecordExtent* extent, const CheckpointMeta& meta, int64_t k) const;

  int fd_;
  std::string path_;
  int moments_;
  int64_t file_bytes_;
  int format_ = 0;
  uint64_t index_checksum_ = 0;  // format 3
  std::vector<Record> records_;
  int64_t bytes_read_ = 0;
};

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_CHECKPOINT_FORMAT_H_
