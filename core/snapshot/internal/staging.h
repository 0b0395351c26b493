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
namespace snapshot_internal {

class StagingBuffer {
 public:
  // The smallest buffer accepted.
  static constexpr int64_t kMinBytes = 4096;

  // Allocates `bytes` of host memory once, through LibTorch's CPU allocator
  // (so memory accounting sees it), page-locked when `pinned` (for device
  // sources on a CUDA build). INVALID_ARGUMENT below kMinBytes,
  // RESOURCE_EXHAUSTED when the allocation fails.
  static absl::StatusOr<std::unique_ptr<StagingBuffer>> Create(int64_t bytes,
                                                               bool pinned);

  int64_t bytes() const { return bytes_; }

  // Streams `src` (any device, any strides, also a view of a mapped file)
  // converted to `out_dtype`, in row-major order, as consecutive chunks of at
  // most bytes() each handed to `sink`. No other host memory is allocated:
  // CPU sources convert straight into the buffer; device sources that need a
  // conversion are copied raw into one part of the buffer and converted into
  // the other. A non-contiguous device source makes LibTorch allocate a
  // device temporary of one chunk. Stops at the first error of `sink`;
  // LibTorch errors come back as statuses.
  absl::Status Stream(
      const at::Tensor& src, at::ScalarType out_dtype,
      absl::FunctionRef<absl::Status(const void* data, size_t size)> sink);

  // Largest device temporary a Stream call may have made (see above).
  int64_t peak_device_temp_bytes() const { return peak_device_temp_bytes_; }

 private:
  StagingBuffer(at::Tensor buffer, int64_t bytes)
      : buffer_(std::move(buffer)), bytes_(bytes) {}
  absl::Status StreamPiece(const at::Tensor& piece, at::ScalarType out_dtype,
                           absl::FunctionRef<absl::Status(const void*, size_t)> sink);

  at::Tensor buffer_;
  int64_t bytes_;
  int64_t peak_device_temp_bytes_ = 0;
};

}  // namespace snapshot_internal
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_INTERNAL_STAGING_H_
