#include "core/snapshot/internal/file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace memprofd {
namespace snapshot::internal {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(
          absl::StrCat(message,
                       " (free space on the snapshot filesystem or raise the "
                       "file size limit, then retry)"));
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EROFS:
    case ENOENT:
    case ENOTDIR:
      return absl::FailedPreconditionError(message);
    case EEXIST:
    case ENOTEMPTY:
      return absl::AlreadyExistsError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<OutputFile> OutputFile::Create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("creating ", path));
  return OutputFile(path, fd);
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), written_(other.written_) {
  other.fd_ = -1;
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status OutputFile::Write(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("writing ", path_, " at byte ", written_));
    }
    if (n == 0) {
      return ErrnoStatus(ENOSPC, absl::StrCat("writing ", path_, " at byte ", written_));
    }
    p += n;
    size -= static_cast<size_t>(n);
    written_ += n;
  }
  return absl::OkStatus();
}

absl::Status OutputFile::SyncAndClose() {
  if (::fsync(fd_) != 0) {
    return ErrnoStatus(errno, absl::StrCat("fsync of ", path_));
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return ErrnoStatus(errno, absl::StrCat("closing ", path_));
  return absl::OkStatus();
}

absl::Status WriteFileSynced(const std::string& path, absl::string_view contents) {
  absl::StatusOr<OutputFile> file = OutputFile::Create(path);
  if (!file.ok()) return file.status();
  absl::Status s = file->Write(contents.data(), contents.size());
  if (!s.ok()) return s;
  return file->SyncAndClose();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          const PathRoots* roots) {
  // O_NONBLOCK: a FIFO in a model directory must not hold the owner thread.
  ASSIGN_OR_RETURN(const int fd,
                   OpenConfined(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC, "file", roots));
  if (fd < 0) {
    if (errno == ENOENT)
      return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    return ErrnoStatus(errno, absl::StrCat("opening ", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, " is not a regular file; memprofd reads only regular files"));
  }
  if (st.st_size > kMaxSmallFileBytes) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, " has ", st.st_size,
                                            " bytes, more than a metadata file holds (",
                                            kMaxSmallFileBytes, ")"));
  }
  std::string out;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, absl::StrCat("reading ", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::Status SyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("opening directory ", path));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("fsync of directory ", path));
  return absl::OkStatus();
}

}  // namespace snapshot::internal
}  // namespace memprofd
