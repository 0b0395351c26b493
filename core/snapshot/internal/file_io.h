#ifndef MEMPROFD_CORE_SNAPSHOT_INTERNAL_FILE_IO_H_
#define MEMPROFD_CORE_SNAPSHOT_INTERNAL_FILE_IO_H_

// POSIX file helpers for snapshots: errno to absl::Status, a write-only file
// that reports ENOSPC/EFBIG as RESOURCE_EXHAUSTED, fsync of files and
// directories. Not thread-safe per object.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/common/files.h"

namespace memprofd {
namespace snapshot::internal {

// `what` ("writing /x/y") and strerror(err) as a status whose code fits err:
// ENOSPC, EDQUOT, EFBIG, ENOMEM -> RESOURCE_EXHAUSTED; EACCES, EPERM ->
// PERMISSION_DENIED; EROFS, ENOENT, ENOTDIR -> FAILED_PRECONDITION;
// EEXIST, ENOTEMPTY -> ALREADY_EXISTS; others -> INTERNAL.
absl::Status ErrnoStatus(int err, absl::string_view what);

// A new file (O_EXCL) written sequentially.
class OutputFile {
 public:
  static absl::StatusOr<OutputFile> Create(const std::string& path);
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) = delete;
  OutputFile(const OutputFile&) = delete;
  ~OutputFile();  // closes without fsync when Close was not called

  // Writes all `size` bytes (retrying short writes and EINTR).
  absl::Status Write(const void* data, size_t size);
  // fsync then close.
  absl::Status SyncAndClose();
  int64_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }

 private:
  OutputFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  int64_t written_ = 0;
};

// Writes `contents` to a new file `path` and fsyncs it.
absl::Status WriteFileSynced(const std::string& path, absl::string_view contents);
// The most ReadSmallFile reads: metadata (config.json, indexes, manifests,
// trainer_state.json) is kilobytes to a few megabytes.
inline constexpr int64_t kMaxSmallFileBytes = int64_t{64} << 20;
// Reads a whole (small) file. NOT_FOUND when missing; DATA_LOSS for anything
// but a regular file (opened without blocking, so a FIFO is refused, not
// waited on) and for one over kMaxSmallFileBytes. With `roots`, the file is
// confined as OpenConfined says (links followed inside the roots,
// PERMISSION_DENIED outside, before anything is read).
absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          const PathRoots* roots = nullptr);
// fsync of a directory, so that entries created or renamed in it persist.
absl::Status SyncDirectory(const std::string& path);

}  // namespace snapshot::internal
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_INTERNAL_FILE_IO_H_
