#include "core/common/files.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/option_status.h"
#include "core/common/status_macros.h"
#include "core/common/utf8.h"

namespace memprofd {
namespace {

namespace fs = std::filesystem;

// The canonical path of `path`, or the errno of the failure.
absl::StatusOr<std::string> RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) {
    return absl::ErrnoToStatus(errno, "realpath");
  }
  return std::string(buf);
}

bool Below(absl::string_view path, absl::string_view root) {
  if (root == "/") return absl::StartsWith(path, "/");
  return path == root || (absl::StartsWith(path, root) && path.size() > root.size() &&
                          path[root.size()] == '/');
}

// Where `path`, which does not resolve, would lead: the links of its last
// component followed (a link to a missing file is not inside a root just
// because the link is), then the part that exists made canonical and the
// rest normalised as written.
std::string WhereItLeads(const std::string& path) {
  fs::path at = fs::path(path).lexically_normal();
  for (int hops = 0; hops < 40; ++hops) {  // the kernel's own limit on links
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(at, ec))) break;
    const fs::path target = fs::read_symlink(at, ec);
    if (ec) break;
    at = (target.is_absolute() ? target : at.parent_path() / target).lexically_normal();
  }
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(at, ec);
  return (ec ? at : resolved).string();
}

// Opens `path` for reading without blocking and checks the handle: the fd
// of a regular file at most `max_bytes` long, and its size.
struct OpenedFile {
  int fd = -1;
  size_t size = 0;
};

absl::StatusOr<OpenedFile> OpenRegular(const std::string& path, int64_t max_bytes,
                                       absl::string_view what, const PathRoots* roots) {
  ASSIGN_OR_RETURN(
      const int fd,
      OpenConfined(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, what,
                   roots));
  if (fd < 0) {
    const int err = errno;
    const std::string p = Echo(path);
    switch (err) {
      case ENOENT:
        return absl::InvalidArgumentError(absl::StrCat(what, " ", p, " does not exist"));
      case EACCES:
      case EPERM:
        return absl::PermissionDeniedError(
            absl::StrCat(what, " ", p, " is not readable by the daemon"));
      case ELOOP:
        return absl::InvalidArgumentError(absl::StrCat(
            what, " ", p, " is a symbolic link; give the path of the file itself"));
      default:
        return absl::InvalidArgumentError(
            absl::StrCat(what, " ", p, " cannot be opened: ", std::strerror(err)));
    }
  }
  auto fail = [fd](absl::Status s) {
    ::close(fd);
    return s;
  };
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(what, " ", Echo(path), ": fstat failed: ", std::strerror(errno))));
  }
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)
                           ? "a device"
                           : "not a regular file";
    return fail(absl::InvalidArgumentError(absl::StrCat(
        what, " ", Echo(path), " is ", kind, "; give the path of a regular file")));
  }
  if (st.st_size > max_bytes) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(what, " ", Echo(path), " has ", st.st_size,
                     " bytes, over the daemon's limit of ", max_bytes, " bytes")));
  }
  return OpenedFile{fd, static_cast<size_t>(st.st_size)};
}

// OpenRegular, and INVALID_ARGUMENT for a file of size 0 (which is also
// how /proc and /sys files present themselves): what ReadOnlyFile reads.
absl::StatusOr<OpenedFile> OpenNonEmptyRegular(const std::string& path, int64_t max_bytes,
                                               absl::string_view what,
                                               const PathRoots* roots) {
  absl::StatusOr<OpenedFile> file = OpenRegular(path, max_bytes, what, roots);
  if (file.ok() && file->size == 0) {
    ::close(file->fd);
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", Echo(path), " is empty (or a /proc or /sys file, which has no size)"));
  }
  return file;
}

}  // namespace

absl::StatusOr<PathRoots> PathRoots::Create(const std::vector<std::string>& roots,
                                            absl::string_view option) {
  PathRoots out;
  out.option_ = std::string(option);
  for (const std::string& root : roots) {
    if (root.empty() || root[0] != '/') {
      return OptionError(
          absl::StatusCode::kInvalidArgument, option,
          absl::StrCat(option, ": ", Echo(root), " must be an absolute path"));
    }
    absl::StatusOr<std::string> real = RealPath(root);
    std::error_code ec;
    if (!real.ok() || !fs::is_directory(*real, ec)) {
      return OptionError(
          absl::StatusCode::kInvalidArgument, option,
          absl::StrCat(option, ": ", Echo(root), " is not an existing directory"));
    }
    out.roots_.push_back(*std::move(real));
  }
  return out;
}

bool PathRoots::Contains(absl::string_view canonical_path) const {
  for (const std::string& root : roots_) {
    if (Below(canonical_path, root)) return true;
  }
  return false;
}

absl::Status PathRoots::CheckOpened(int fd, absl::string_view path,
                                    absl::string_view what) const {
  // What was opened, not what was checked: a rename in between shows here.
  absl::StatusOr<std::string> opened = RealPath(absl::StrCat("/proc/self/fd/", fd));
  if (opened.ok() && Contains(*opened)) return absl::OkStatus();
  return OptionError(absl::StatusCode::kPermissionDenied, option_,
                     absl::StrCat(what, " ", Echo(path),
                                  " changed while it was opened and is not inside the "
                                  "daemon's data roots (",
                                  Describe(), ")"));
}

absl::StatusOr<int> OpenConfined(const std::string& path, int flags,
                                 absl::string_view what, const PathRoots* roots) {
  if (roots == nullptr) return ::open(path.c_str(), flags);
  ASSIGN_OR_RETURN(const std::string canonical, roots->Confine(path, what));
  const int fd = ::open(canonical.c_str(), flags | O_NOFOLLOW);
  if (fd < 0) return fd;  // errno is open's
  // Before anything about the file is learnt (its kind, its size).
  if (absl::Status inside = roots->CheckOpened(fd, path, what); !inside.ok()) {
    ::close(fd);
    return inside;
  }
  return fd;
}

std::string PathRoots::Describe() const {
  if (roots_.empty()) return absl::StrCat("none: no ", option_, " is set");
  return absl::StrJoin(roots_, ", ");
}

absl::StatusOr<std::string> PathRoots::Confine(absl::string_view path,
                                               absl::string_view what) const {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Echo(path), " contains a NUL byte"));
  }
  if (path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Echo(path),
                     " is relative; give an absolute path on the daemon's host"));
  }
  auto denied = [&] {
    return OptionError(
        absl::StatusCode::kPermissionDenied, option_,
        absl::StrCat(what, " ", Echo(path), " is outside the daemon's data roots (",
                     Describe(), "); put the file under a root, or add its directory to ",
                     option_));
  };
  if (roots_.empty()) return denied();
  const std::string p(path);
  absl::StatusOr<std::string> real = RealPath(p);
  if (!real.ok()) {
    // Missing (or unreadable on the way): said only for a path that leads
    // inside a root, so that nothing is learnt about others.
    if (!Contains(WhereItLeads(p))) return denied();
    return absl::NotFoundError(absl::StrCat(what, " ", Echo(path), " does not exist"));
  }
  if (!Contains(*real)) return denied();
  return *std::move(real);
}

absl::StatusOr<std::unique_ptr<ReadOnlyFile>> ReadOnlyFile::Open(const std::string& path,
                                                                 int64_t max_bytes,
                                                                 absl::string_view what,
                                                                 const PathRoots* roots) {
  absl::StatusOr<OpenedFile> file = OpenNonEmptyRegular(path, max_bytes, what, roots);
  if (!file.ok()) return file.status();
  return std::unique_ptr<ReadOnlyFile>(new ReadOnlyFile(
      path, std::string(what), file->fd, static_cast<int64_t>(file->size)));
}

ReadOnlyFile::~ReadOnlyFile() { ::close(fd_); }

absl::Status ReadOnlyFile::ReadAt(int64_t offset, int64_t length, void* out) const {
  auto* dst = static_cast<char*>(out);
  int64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd_, dst + done, static_cast<size_t>(length - done),
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      return absl::DataLossError(absl::StrCat(
          what_, " ", Echo(path_),
          err != 0 ? absl::StrCat(" could not be read: ", std::strerror(err))
                   : absl::StrCat(" ends before byte ", offset + length,
                                  ": it shrank or was replaced since it was checked"),
          "; leave a training's data files unchanged while it runs"));
    }
    done += n;
  }
  return absl::OkStatus();
}

void ReadOnlyFile::Release(int64_t offset, int64_t length) const {
  ::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(length),
                  POSIX_FADV_DONTNEED);
}

absl::StatusOr<std::string> ReadSmallRegularFile(const std::string& path,
                                                 int64_t max_bytes,
                                                 absl::string_view what,
                                                 const PathRoots* roots) {
  absl::StatusOr<OpenedFile> file = OpenRegular(path, max_bytes, what, roots);
  if (!file.ok()) return file.status();
  std::string out(file->size, '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(file->fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(file->fd);
      return absl::DataLossError(
          absl::StrCat("reading ", what, " ", Echo(path), " failed: ",
                       err != 0 ? std::strerror(err)
                                : "it is shorter than its size (changed meanwhile)"));
    }
    done += static_cast<size_t>(n);
  }
  ::close(file->fd);
  return out;
}

}  // namespace memprofd
