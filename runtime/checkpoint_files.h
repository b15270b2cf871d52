// The files of a checkpoint, written so that a crash never costs the previous checkpoint and
// read so that damage is found before anything is loaded (internal to runtime).
//
// A checkpoint directory is written under DIR.partial and becomes DIR in one rename
// (PublishDirectory) once every file in it is on stable storage; each rank file ends with the
// XXH3-64 of everything before it (ChecksummedFile, VerifyChecksum).
#ifndef ZERO_RUNTIME_CHECKPOINT_FILES_H_
#define ZERO_RUNTIME_CHECKPOINT_FILES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "zero/status.h"

namespace zero::runtime {

/// Bytes of the checksum trailer at the end of a checksummed file.
inline constexpr size_t kChecksumBytes = 8;

/// A file written front to back whose last 8 bytes are the XXH3-64 of what precedes them.
class ChecksummedFile {
 public:
  /// Creates (truncates) `path`. kUnavailable names the path and the system's reason.
  static StatusOr<std::unique_ptr<ChecksummedFile>> Create(const std::string& path);
  ~ChecksummedFile();
  ChecksummedFile(const ChecksummedFile&) = delete;
  ChecksummedFile& operator=(const ChecksummedFile&) = delete;

  /// Appends `bytes` bytes.
  Status Write(const void* data, size_t bytes);
  /// Appends the checksum, flushes the file to stable storage (fsync) and closes it.
  Status Close();

 private:
  ChecksummedFile(int fd, std::string path);
  int fd_;
  std::string path_;
  struct HashState;
  std::unique_ptr<HashState> hash_;
};

/// Checks the trailer of a checksummed file against its contents. kDataLoss names the file
/// and says what is wrong (too short, or the checksums); kUnavailable when it cannot be read.
Status VerifyChecksum(const std::string& path);

/// Writes `text` to `path` and flushes it to stable storage.
Status WriteFileDurably(const std::string& path, const std::string& text);

/// Makes the finished directory `partial` visible as `dir`: `dir`'s previous contents are
/// replaced in one atomic step (renameat2 RENAME_EXCHANGE, then the old contents are deleted;
/// on file systems without it, `dir` is renamed aside first, so a crash in between leaves
/// DIR.old and DIR.partial, both complete). The parent directory is synced after.
Status PublishDirectory(const std::string& partial, const std::string& dir);

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_CHECKPOINT_FILES_H_
