// Reading a checkpoint without an engine: what it holds, whether it is intact, and each
// param's full fp32 value assembled from every rank's shard (what zero-ckpt's inspect, verify
// and consolidate do; DeepSpeed users know the last as zero_to_fp32).
//
//   auto reader = zero::CheckpointReader::Open("ckpt");      // or a series root with `latest`
//   for (int p = 0; p < reader->params().size(); ++p) ...      // names, shapes, dtypes
//   zero::Status intact = (*reader)->Verify();                // every record's checksum
//   std::vector<float> w(numel); (*reader)->ReadParam(p, w.data());
//
// The format is described in runtime/checkpoint_format.h; Engine::SaveCheckpoint writes it.
#ifndef ZERO_CHECKPOINT_H_
#define ZERO_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero/dtype.h"
#include "zero/status.h"

namespace zero {

class CheckpointReader {
 public:
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype = DType::kFP32;  ///< the dtype it was trained in (records are fp32 masters)
    bool requires_grad = true;   ///< false: frozen (its records hold weights, no moments)
    bool saved = true;           ///< has records: trainable params, and frozen params saved
                                 ///< with checkpoint.save_frozen
    int64_t numel = 0;
    std::vector<std::string> aliases;  ///< its other names (a tied weight's; Engine::AddParamAlias)
  };
  struct File {
    std::string path;
    int64_t bytes = 0;    ///< size on disk (0 when missing)
    int64_t records = 0;  ///< records in its index
    Status status;        ///< OK, or what is wrong with its index (after Verify: or a record)
  };

  /// Reads `dir`/meta.json (or the checkpoint `dir`/latest names) and every rank file's index.
  /// Fails only when meta.json is missing or damaged (the error names the field); a missing or
  /// damaged rank file shows in files()[r].status.
  static StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& dir);
  ~CheckpointReader();

  const std::string& dir() const;  ///< the checkpoint directory itself (after `latest`)
  int format() const;
  int world() const;               ///< ranks that wrote it
  int stage() const;
  int64_t step() const;            ///< optimizer steps taken
  const std::string& optimizer() const;
  int moments() const;             ///< moment buffers per element (AdamW: 2)
  const std::string& user_data() const;
  float loss_scale() const;
  const std::vector<Param>& params() const;
  const std::vector<File>& files() const;

  /// Reads every record of every file and checks its checksum, and that the records cover
  /// every element of every saved param exactly once. OK only if the checkpoint is complete
  /// and intact; otherwise the first problem, with files() updated.
  Status Verify();
  /// The full fp32 value of param `param` (params()[param].numel floats into `out`), from the
  /// records of every file. kFailedPrecondition for a param not saved (a frozen param without
  /// checkpoint.save_frozen); kDataLoss when a record is damaged or elements are missing.
  Status ReadParam(int param, float* out);

 private:
  struct State;
  explicit CheckpointReader(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// Rewrites checkpoint `dir` (or the one `dir`/latest names) into directory `out` as the rank
/// files a job at `world` ranks writes (the stage-1 layout with the default bucket sizes, which
/// stages 1-3 share; a job at any stage and bucket size loads it), without building engines:
/// memory is the files' indexes plus one record, whatever `world` is. Every record read is
/// checked against its checksum; `out` is published in one rename, as a save is. meta.json
/// keeps everything but the world size and stage (step, groups, per-param steps, loss scaler,
/// user data).
Status ReshardCheckpoint(const std::string& dir, int world, const std::string& out);

}  // namespace zero

#endif  // ZERO_CHECKPOINT_H_
