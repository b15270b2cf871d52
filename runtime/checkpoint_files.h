// The files of a checkpoint, written so that a crash never costs the previous checkpoint and
// read so that damage is found before anything is loaded (internal to runtime).
//
// A checkpoint directory is written under DIR.partial and becomes DIR in one rename
// (PublishDirectory) once every file in it is on stable storage. The rank files' own format
// is in checkpoint_format.h.
#ifndef ZERO_RUNTIME_CHECKPOINT_FILES_H_
#define ZERO_RUNTIME_CHECKPOINT_FILES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "zero/status.h"

namespace zero::runtime {

/// Bytes of the checksum trailer at the end of a format-2 rank file.
inline constexpr size_t kChecksumBytes = 8;

/// Writes all `bytes` of `data` to the file descriptor `fd` (retrying short writes);
/// kUnavailable names `path` and the system's reason.
Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path);

/// A regular file open for reading (the caller closes `fd`) and its size.
struct OpenedFile {
  int fd = -1;
  int64_t size = 0;
};
/// Opens `path` for reading without waiting on what is not a file (a FIFO, a device): kNotFound
/// when it does not exist; `not_regular` (a status code) when it is not a regular file (a
/// directory, a FIFO, a device); kUnavailable when it cannot be opened or examined.
StatusOr<OpenedFile> OpenRegularFile(const std::string& path, absl::StatusCode not_regular);

/// Checks the trailer of a format-2 rank file (the XXH3-64 of everything before it). kDataLoss names the file
/// and says what is wrong (too short, or the checksums); kUnavailable when it cannot be read.
Status VerifyChecksum(const std::string& path);

/// The whole content of the regular file `path` (at most `max_bytes`). kNotFound when it does
/// not exist; kInvalidArgument when it is not a regular file (a directory, a device) or is
/// larger; kUnavailable when it cannot be read. Never throws, whatever `path` names.
StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes);

/// Writes `text` to `path` and flushes it to stable storage.
Status WriteFileDurably(const std::string& path, const std::string& text);
/// Replaces `path` by a file holding `text` in one rename: a reader sees the old or the new
/// text, never a mix (`path`.tmp is written and synced first; the directory after).
Status ReplaceFileAtomically(const std::string& path, const std::string& text);

/// An exclusive lock on a directory, held while one job saves a checkpoint into it (and, for a
/// series root, for as long as the job's engine lives) so that two jobs saving into the same
/// place never mix or replace each other's files: the second waits for the first. It is an
/// flock on the regular file DIR/.zerort-lock (a directory's own fd cannot be locked on NFS),
/// which names its holder (pid and host) for the waiting job's message; on a file system
/// without flock (Lustre without -o flock) saving goes on unlocked, and unlocked_because() says
/// why. Released when destroyed, and by the system if the process dies.
class DirectoryLock {
 public:
  /// Locks `dir` (which must exist), waiting up to `timeout_s` seconds (0: forever) for
  /// another holder; then kFailedPrecondition naming the directory.
  static StatusOr<DirectoryLock> Acquire(const std::string& dir, double timeout_s);
  DirectoryLock(DirectoryLock&& other) noexcept
      : fd_(other.fd_), unlocked_because_(std::move(other.unlocked_because_)) {
    other.fd_ = -1;
  }
  DirectoryLock& operator=(DirectoryLock&&) = delete;
  DirectoryLock(const DirectoryLock&) = delete;
  ~DirectoryLock();
  /// Empty when the lock is held; else why the file system could not lock.
  const std::string& unlocked_because() const { return unlocked_because_; }

 private:
  DirectoryLock(int fd, std::string unlocked_because) : fd_(fd), unlocked_because_(std::move(unlocked_because)) {}
  int fd_;
  std::string unlocked_because_;
};

/// The directory holding `path` ("." for a bare name).
std::string ParentOf(const std::string& path);

/// kFailedPrecondition (its message starting with `what`) when `dir` exists and is neither an
/// earlier checkpoint (a directory holding meta.json) nor an empty directory: a file, or a
/// directory of other data, that publishing a checkpoint there would delete.
Status RefuseToReplaceOtherData(const std::string& dir, const std::string& what);

/// Makes the finished directory `partial` visible as `dir`: `dir`'s previous contents are
/// replaced in one atomic step (renameat2 RENAME_EXCHANGE, then the old contents are deleted;
/// on file systems without it, `dir` is renamed aside first, so a crash in between leaves
/// DIR.old and DIR.partial, both complete). The parent directory is synced after.
Status PublishDirectory(const std::string& partial, const std::string& dir);

}  // namespace zero::runtime

#endif  // ZERO_RUNTIME_CHECKPOINT_FILES_H_
