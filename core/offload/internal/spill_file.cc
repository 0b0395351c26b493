#include "core/offload/internal/spill_file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace memprofd::offload::internal {
namespace {

absl::Status ErrnoStatus(absl::string_view what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SpillFile>> SpillFile::Open(const std::string& dir) {
  std::string path = absl::StrCat(dir.empty() ? "." : dir, "/memprofd-spill-XXXXXX");
  std::vector<char> buf(path.begin(), path.end());
  buf.push_back('\0');
  const int fd = mkostemp(buf.data(), O_CLOEXEC);
  if (fd < 0) {
    return ErrnoStatus(absl::StrCat("cannot create a spill file in \"", dir,
                                    "\" (set spill_dir to a writable directory)"),
                       errno);
  }
  // Unlinked at once: the space goes back to the file system when the fd
  // closes, even if the process dies.
  unlink(buf.data());
  return std::unique_ptr<SpillFile>(new SpillFile(fd, dir.empty() ? "." : dir));
}

SpillFile::~SpillFile() { close(fd_); }

int64_t SpillFile::Allocate(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  held_ += bytes;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const int64_t offset = it->first;
    const int64_t rest = it->second - bytes;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + bytes, rest);
    return offset;
  }
  const int64_t offset = end_;
  end_ += bytes;
  return offset;
}

void SpillFile::Free(int64_t offset, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  held_ -= bytes;
  if (held_ == 0) {
    free_.clear();
    end_ = 0;
    // Nothing is held, so no write is in flight: give the blocks back.
    (void)ftruncate(fd_, 0);
    return;
  }
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  if (offset + bytes == end_) {
    end_ = offset;
  } else {
    free_.emplace(offset, bytes);
  }
}

absl::Status SpillFile::Write(int64_t offset, const void* data, int64_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = pwrite(fd_, p, static_cast<size_t>(bytes), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
        // A full disk is the caller's to fix, not an internal error.
        return absl::ResourceExhaustedError(absl::StrCat(
            "the spill directory \"", dir_, "\" is full (", std::strerror(err),
            ") while offloading activations to disk: free space there, set spill_dir "
            "to a larger file system, offload to host, or train without offloading"));
      }
      return ErrnoStatus("writing the spill file", err);
    }
    p += n;
    offset += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status SpillFile::Read(int64_t offset, void* data, int64_t bytes) const {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = pread(fd_, p, static_cast<size_t>(bytes), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("reading the spill file", errno);
    }
    if (n == 0) return absl::DataLossError("the spill file is shorter than expected");
    p += n;
    offset += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

int64_t SpillFile::bytes_held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

int64_t SpillFile::file_bytes() const {
  absl::MutexLock lock(&mu_);
  return end_;
}

}  // namespace memprofd::offload::internal
