#ifndef MEMPROFD_CORE_OFFLOAD_INTERNAL_DEVICE_COPY_H_
#define MEMPROFD_CORE_OFFLOAD_INTERNAL_DEVICE_COPY_H_

// Copies between a CUDA compute device and host memory. Compiled for real only
// with MEMPROFD_WITH_CUDA; otherwise every function throws (the offloader
// never calls them: Create rejects CUDA devices in such builds). Written
// against the APIs of LibTorch 2.6 and later.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace memprofd::offload::internal {

// Completion of an asynchronous copy (a CUDA event); opaque here.
using CopyDone = std::shared_ptr<void>;

// True when this build has the CUDA paths.
bool DeviceCopyHasCuda();

// Allocates `bytes` of pinned host memory (a kByte CPU tensor).
at::Tensor EmptyPinned(int64_t bytes);

// Starts copying `src` (a kByte CUDA tensor) into `host` (pinned, same size)
// on a side stream ordered after the work queued so far on the current
// stream; tells the caching allocator that the side stream uses `src`'s
// block. Returns the copy's completion.
CopyDone StartCopyToHost(const at::Tensor& src, const at::Tensor& host);
// Whether the copy completed (never blocks) / blocks until it did.
bool CopyFinished(const CopyDone& done);
void WaitCopy(const CopyDone& done);

// One copy back: pinned `host` into `dst` (a CUDA kByte tensor, same size).
struct HostToDevice {
  at::Tensor host;
  at::Tensor dst;
};
// Starts `copies` (destinations on one device, allocated on the calling
// thread's current stream) on a side stream ordered after the work queued so
// far on that stream, without blocking the host; the pinned blocks are kept
// until the copies ran, and the caching allocator is told that the side
// stream uses the destinations. Returns their completion; null when
// `copies` is empty.
CopyDone StartCopiesToDevice(const std::vector<HostToDevice>& copies);
// Makes the calling thread's current stream on `buffer`'s device wait for
// `done` (the host does not wait) and tells the caching allocator that this
// stream uses `buffer`, so it is not reused before the stream's work on it
// ran. No-op for a null `done`.
void UseOnCurrentStream(const CopyDone& done, const at::Tensor& buffer);

}  // namespace memprofd::offload::internal

#endif  // MEMPROFD_CORE_OFFLOAD_INTERNAL_DEVICE_COPY_H_
