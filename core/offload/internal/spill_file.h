#ifndef MEMPROFD_CORE_OFFLOAD_INTERNAL_SPILL_FILE_H_
#define MEMPROFD_CORE_OFFLOAD_INTERNAL_SPILL_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace memprofd::offload::internal {

// An anonymous file (created in a directory, unlinked at once) whose space is
// handed out in extents and reused after they are freed: first fit over a
// coalescing free list; the file is truncated to zero whenever nothing is
// held. Thread-safe: Allocate/Free lock; Write/Read use pwrite/pread on
// extents the caller owns, so they run concurrently.
class SpillFile {
 public:
  // INTERNAL (with errno text) when `dir` does not allow creating a file.
  static absl::StatusOr<std::unique_ptr<SpillFile>> Open(const std::string& dir);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  // Reserves `bytes` (> 0) and returns the extent's offset.
  int64_t Allocate(int64_t bytes);
  // Returns an extent obtained from Allocate.
  void Free(int64_t offset, int64_t bytes);

  // Whole-extent I/O; the status names the failing call and errno.
  absl::Status Write(int64_t offset, const void* data, int64_t bytes);
  absl::Status Read(int64_t offset, void* data, int64_t bytes) const;

  // Bytes in allocated extents, and the file's logical size.
  int64_t bytes_held() const;
  int64_t file_bytes() const;

 private:
  SpillFile(int fd, std::string dir) : fd_(fd), dir_(std::move(dir)) {}

  const int fd_;
  const std::string dir_;  // where it lives, for messages
  mutable absl::Mutex mu_;
  std::map<int64_t, int64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> bytes
  int64_t end_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace memprofd::offload::internal

#endif  // MEMPROFD_CORE_OFFLOAD_INTERNAL_SPILL_FILE_H_
