#ifndef MEMPROFD_CORE_SNAPSHOT_INTERNAL_STAGING_H_
#define MEMPROFD_CORE_SNAPSHOT_INTERNAL_STAGING_H_

// The one fixed host buffer a snapshot streams every tensor through.
// Owner thread only (not thread-safe).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace memprofd {
namespace snapshot::internal {

class StagingBuffer {
 public:
  // The smallest buffer accepted.
  static constexpr int64_t kMinBytes = 4096;

  // A buffer of `bytes`, allocated at the first Stream that needs it, once,
  // through LibTorch's CPU allocator (so memory accounting sees it), or its
  // page-locked host allocator when `pinned` (device sources on a CUDA
  // build).
  // INVALID_ARGUMENT below kMinBytes.
  static absl::StatusOr<std::unique_ptr<StagingBuffer>> Create(int64_t bytes,
                                                               bool pinned);

  int64_t bytes() const { return bytes_; }
  // Host bytes allocated so far: bytes() once a stream needed the buffer,
  // else 0.
  int64_t allocated_bytes() const { return buffer_.defined() ? bytes_ : 0; }

  // Streams `src` (any device, any strides, also a view of a mapped file)
  // converted to `out_dtype`, in row-major order, as consecutive chunks of at
  // most bytes() each handed to `sink`. No other host memory is allocated:
  // contiguous host tensors already in `out_dtype` (CPU or mapped) are handed
  // to `sink` straight from their memory (zero copy, no buffer); other CPU
  // sources convert straight into the buffer; device sources that need a
  // conversion are copied raw into one part of the buffer and converted into
  // the other. A non-contiguous device source makes LibTorch allocate a
  // device temporary of one chunk. Stops at the first error of `sink`;
  // LibTorch errors (also RESOURCE_EXHAUSTED when the buffer cannot be
  // allocated) come back as statuses.
  absl::Status Stream(
      const at::Tensor& src, at::ScalarType out_dtype,
      absl::FunctionRef<absl::Status(const void* data, size_t size)> sink);

  // Largest device temporary a Stream call may have made (see above).
  int64_t peak_device_temp_bytes() const { return peak_device_temp_bytes_; }

 private:
  StagingBuffer(int64_t bytes, bool pinned) : bytes_(bytes), pinned_(pinned) {}
  absl::Status EnsureAllocated();
  absl::Status StreamPiece(const at::Tensor& piece, at::ScalarType out_dtype,
                           absl::FunctionRef<absl::Status(const void*, size_t)> sink);

  at::Tensor buffer_;
  int64_t bytes_;
  bool pinned_;
  int64_t peak_device_temp_bytes_ = 0;
};

}  // namespace snapshot::internal
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_INTERNAL_STAGING_H_
