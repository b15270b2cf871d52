// Crash-safe checkpoint files: durable writes and atomic publication.
#include "runtime/checkpoint_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

// Header-only XXH3 (Debian's libxxhash-dev): nothing to link.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zero::runtime {
namespace {

Status SystemError(const char* what, const std::string& path) {
  return absl::UnavailableError(
      absl::StrCat("checkpoint: cannot ", what, " ", path, ": ", std::strerror(errno)));
}

// fsync of a directory, so that the names created or renamed in it are durable.
Status SyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return SystemError("open directory", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0 && errno != EINVAL) return SystemError("sync directory", path);
  return absl::OkStatus();
}

// This process as a lock file names its holder: "pid 4242 on node17".
std::string HolderName() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return absl::StrCat("pid ", ::getpid(), " on ", host);
}

}  // namespace

std::string ParentOf(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

StatusOr<DirectoryLock> DirectoryLock::Acquire(const std::string& dir, double timeout_s) {
  const std::string path = dir + "/.zerort-lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return SystemError("create the lock file", path);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  const std::string holder = HolderName();
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == ENOLCK || errno == ENOSYS || errno == EOPNOTSUPP || errno == EBADF || errno == EINVAL) {
      std::string reason = std::strerror(errno);
      ::close(fd);
      return DirectoryLock(-1, absl::StrCat("the file system cannot lock ", path, " (", reason, ")"));
    }
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const Status failed = SystemError("lock", path);
      ::close(fd);
      return failed;
    }
    char held_by[256] = {};
    const ssize_t got = ::pread(fd, held_by, sizeof(held_by) - 1, 0);
    const std::string who = got > 0 ? std::string(held_by, static_cast<size_t>(got)) : "another process";
    if (who == holder) {  // another engine of this process: waiting for it would never end
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint: another engine of this process (", who, ") holds ", path, ": it saved a series into ", dir,
          " and is still open; give each engine a checkpoint directory of its own, or close the other first"));
    }
    if (timeout_s > 0 && std::chrono::steady_clock::now() >= deadline) {
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint: another job (", who, ") has held ", path, " for ", timeout_s, " s: it is saving into ",
          dir, ", or saved a series there and is still running; give each job (and each engine) a "
          "checkpoint directory of its own"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Who holds it, for the message of a job that waits for it (best effort: only that message
  // would lack the name).
  if (::ftruncate(fd, 0) == 0) {
    const ssize_t written = ::pwrite(fd, holder.data(), holder.size(), 0);
    static_cast<void>(written);
  }
  return DirectoryLock(fd, "");
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* next = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t written = ::write(fd, next, bytes);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return SystemError("write", path);
    next += written;
    bytes -= static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

StatusOr<OpenedFile> OpenRegularFile(const std::string& path, absl::StatusCode not_regular) {
  // O_NONBLOCK: opening a FIFO or a device must not wait (fstat below refuses them); it changes
  // nothing for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("checkpoint: ", path, " does not exist"));
    return SystemError("open", path);
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const Status failed = SystemError("stat", path);
    ::close(fd);
    return failed;
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return Status(not_regular, absl::StrCat("checkpoint: ", path, " is not a regular file",
                                            S_ISDIR(info.st_mode) ? " (it is a directory)" : ""));
  }
  return OpenedFile{fd, static_cast<int64_t>(info.st_size)};
}

Status VerifyChecksum(const std::string& path) {
  // A rank file that is not a file: the checkpoint is damaged, as RankFileReader says.
  ZERO_ASSIGN_OR_RETURN(const OpenedFile file, OpenRegularFile(path, absl::StatusCode::kDataLoss));
  const int fd = file.fd;
  const auto size = static_cast<uint64_t>(file.size);
  if (size < kChecksumBytes) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat("checkpoint: ", path, " is truncated (", size,
                                            " bytes, shorter than its checksum)"));
  }
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> chunk(size_t{1} << 20);
  uint64_t left = size - kChecksumBytes;
  Status status;
  while (left > 0 && status.ok()) {
    const ssize_t got = ::read(fd, chunk.data(), static_cast<size_t>(std::min<uint64_t>(left, chunk.size())));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      status = SystemError("read", path);
      break;
    }
    XXH3_64bits_update(state, chunk.data(), static_cast<size_t>(got));
    left -= static_cast<uint64_t>(got);
  }
  uint64_t stored = 0;
  if (status.ok() && ::read(fd, &stored, sizeof stored) != static_cast<ssize_t>(sizeof stored)) {
    status = SystemError("read", path);
  }
  const uint64_t computed = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  ::close(fd);
  ZERO_RETURN_IF_ERROR(status);
  if (stored != computed) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint: %s is corrupt: its contents hash to %016x but it records %016x (a "
        "damaged or partly written file); load an older checkpoint", path, computed, stored));
  }
  return absl::OkStatus();
}

StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes) {
  ZERO_ASSIGN_OR_RETURN(const OpenedFile file, OpenRegularFile(path, absl::StatusCode::kInvalidArgument));
  const int fd = file.fd;
  Status status;
  if (file.size > max_bytes) {
    status = absl::InvalidArgumentError(
        absl::StrCat("checkpoint: ", path, " has ", file.size, " bytes; at most ", max_bytes, " expected"));
  }
  std::string text;
  if (status.ok()) {
    text.resize(static_cast<size_t>(file.size));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status = n < 0 ? SystemError("read", path)
                       : absl::DataLossError(absl::StrCat("checkpoint: ", path, " ended while it was read"));
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  ZERO_RETURN_IF_ERROR(status);
  return text;
}

Status WriteFileDurably(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return SystemError("create", path);
  Status status = WriteAll(fd, text.data(), text.size(), path);
  if (status.ok() && ::fsync(fd) != 0) status = SystemError("sync", path);
  if (::close(fd) != 0 && status.ok()) status = SystemError("close", path);
  return status;
}

Status ReplaceFileAtomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  ZERO_RETURN_IF_ERROR(WriteFileDurably(temporary, text));
  if (::rename(temporary.c_str(), path.c_str()) != 0) return SystemError("rename into", path);
  return SyncDirectory(ParentOf(path));
}

Status RefuseToReplaceOtherData(const std::string& dir, const std::string& what) {
  std::error_code error;
  if (!std::filesystem::exists(dir, error)) return absl::OkStatus();
  const bool directory = std::filesystem::is_directory(dir, error);
  if (directory && (std::filesystem::exists(dir + "/meta.json", error) || std::filesystem::is_empty(dir, error))) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": ", dir, " exists and is ", directory ? "a directory that holds no ZeroRT checkpoint" : "not a directory",
      "; a checkpoint replaces its directory whole, so this one would be lost. Write into a new or empty directory, "
      "or (SaveCheckpoint) give a tag: root/tag is written and root/latest points at it, beside what root holds"));
}

Status PublishDirectory(const std::string& partial, const std::string& dir) {
  ZERO_RETURN_IF_ERROR(SyncDirectory(partial));
  std::error_code error;
  if (!std::filesystem::exists(dir, error)) {
    if (::rename(partial.c_str(), dir.c_str()) != 0) return SystemError("rename into", dir);
    return SyncDirectory(ParentOf(dir));
  }
  if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    ZERO_RETURN_IF_ERROR(SyncDirectory(ParentOf(dir)));
    std::filesystem::remove_all(partial, error);  // now the previous checkpoint
    return absl::OkStatus();
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return SystemError("swap in", dir);
  const std::string old = dir + ".old";
  std::filesystem::remove_all(old, error);
  if (::rename(dir.c_str(), old.c_str()) != 0) return SystemError("rename aside", dir);
  if (::rename(partial.c_str(), dir.c_str()) != 0) return SystemError("rename into", dir);
  ZERO_RETURN_IF_ERROR(SyncDirectory(ParentOf(dir)));
  std::filesystem::remove_all(old, error);
  return absl::OkStatus();
}

}  // namespace zero::runtime
