#ifndef MEMPROFD_CORE_COMMON_FILES_H_
#define MEMPROFD_CORE_COMMON_FILES_H_

// Files a client names: confined to the operator's roots, opened once,
// checked through the handle, never blocking and never read whole into
// memory. No LibTorch.
//
// Why each step: a path checked and then opened separately can be swapped
// between the two (a FIFO renamed over a file); opening a FIFO for reading
// blocks until a writer comes, and a /proc file can block in read() (kmsg),
// so the open is O_NONBLOCK and only a regular file of known size is taken;
// files are read with pread, never mapped, since a mapped page past a
// truncation raises SIGBUS, which would kill the daemon. Every message
// quotes the path through Echo and never the file's contents.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {

// The directories client-named paths must resolve into (after symbolic
// links). Immutable after Create; thread-safe.
class PathRoots {
 public:
  // No roots: every client-named path is refused.
  PathRoots() = default;

  // Each root is made absolute and canonical (it must exist and be a
  // directory). INVALID_ARGUMENT naming `option` (the engine option that
  // lists the roots, "data_roots") and the root otherwise. Statuses about
  // the roots are marked as about `option` (option_status.h).
  static absl::StatusOr<PathRoots> Create(const std::vector<std::string>& roots,
                                          absl::string_view option);

  // The canonical path of `path` when it resolves inside one of the roots.
  // INVALID_ARGUMENT for an empty path, a NUL byte, or a relative path;
  // PERMISSION_DENIED naming the roots when it resolves outside them (or
  // there are none); NOT_FOUND only for a missing path inside a root (so
  // nothing is said about what exists outside). `what` names the field
  // ("data.text_file") in every message.
  absl::StatusOr<std::string> Confine(absl::string_view path,
                                      absl::string_view what) const;

  // True when the canonical `path` is one of the roots or below one.
  bool Contains(absl::string_view canonical_path) const;

  // OK when the file open at `fd` (opened from `path`, which Confine
  // resolved) still lies inside the roots: a rename between the check and
  // the open shows here. PERMISSION_DENIED naming `what` and `path`
  // otherwise, with nothing about the file itself.
  absl::Status CheckOpened(int fd, absl::string_view path, absl::string_view what) const;

  const std::vector<std::string>& roots() const { return roots_; }
  // "/data, /srv/corpora" or "none: no data_roots is set".
  std::string Describe() const;

 private:
  std::vector<std::string> roots_;  // canonical, absolute
  std::string option_ = "data_roots";
};

// A regular file read at offsets with pread(). Open refuses anything else
// without blocking: FIFOs, devices, directories, sockets, symbolic links as
// the last component (without `roots`; with them, links are followed as
// OpenConfined says), files of size 0 (which is also how /proc files present
// themselves) and files over `max_bytes`: INVALID_ARGUMENT saying which,
// and for a missing file; PERMISSION_DENIED when the daemon may not read
// it, or, with `roots`, when it leads outside them. Unlike a mapping, a
// file that shrinks or is rewritten underneath cannot kill the process (a
// mapped page past a truncation raises SIGBUS): a read that comes back short
// is DATA_LOSS naming the file. For data the daemon reads in windows over a
// run (token files, a Megatron pair). Immutable; thread-safe (pread has no
// shared offset).
class ReadOnlyFile {
 public:
  static absl::StatusOr<std::unique_ptr<ReadOnlyFile>> Open(
      const std::string& path, int64_t max_bytes, absl::string_view what,
      const PathRoots* roots = nullptr);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  // The size when it was opened.
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Reads bytes [offset, offset + length) into `out`. DATA_LOSS naming the
  // file (`what` at Open) when it is shorter now than that (it shrank or
  // was replaced in place since it was opened) or the read fails.
  absl::Status ReadAt(int64_t offset, int64_t length, void* out) const;

  // Tells the kernel the page cache of [offset, offset + length) is not
  // needed now, so that a scan over a large file keeps only a window.
  void Release(int64_t offset, int64_t length) const;

 private:
  ReadOnlyFile(std::string path, std::string what, int fd, int64_t size)
      : path_(std::move(path)), what_(std::move(what)), fd_(fd), size_(size) {}

  const std::string path_;
  const std::string what_;
  const int fd_;
  const int64_t size_;
};

// The whole of a small regular file (config.json, an index), opened as
// ReadOnlyFile::Open opens, read with read() up to `max_bytes`. The same
// statuses; a size-0 file is read as empty, not refused.
absl::StatusOr<std::string> ReadSmallRegularFile(const std::string& path,
                                                 int64_t max_bytes,
                                                 absl::string_view what,
                                                 const PathRoots* roots = nullptr);

// Opens `path` with open(2) `flags` under one rule for every file the daemon
// reads for a client: with `roots`, `path` is resolved first (symbolic links
// followed) and must lie inside them (PathRoots::Confine's statuses, before
// anything is opened, so that nothing is read or sized outside), its
// canonical path is opened with O_NOFOLLOW added, and what was opened is
// checked again (PathRoots::CheckOpened; the fd is closed on failure).
// Without roots, `path` itself is opened. Those statuses are returned;
// otherwise the fd, or -1 with errno set by open(2), for the caller to word.
absl::StatusOr<int> OpenConfined(const std::string& path, int flags,
                                 absl::string_view what, const PathRoots* roots);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_FILES_H_
