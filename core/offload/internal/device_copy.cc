#include "core/offload/internal/device_copy.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#ifdef MEMPROFD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace memprofd::offload::internal {

#ifdef MEMPROFD_WITH_CUDA

bool DeviceCopyHasCuda() { return true; }

at::Tensor EmptyPinned(int64_t bytes) {
  return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
}

namespace {

// Copies run on a pool stream (round robin), ordered after everything queued
// so far on the current stream of `index`: a source may still be being
// produced there, and a destination's block may still be read there by work
// queued before it was freed and handed out again.
c10::cuda::CUDAStream SideStreamAfterCurrent(c10::DeviceIndex index) {
  c10::cuda::CUDAStream side =
      c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index);
  at::cuda::CUDAEvent queued;
  queued.record(c10::cuda::getCurrentCUDAStream(index));
  queued.block(side);
  return side;
}

// Completion of what is queued on `side` so far.
CopyDone RecordDone(const c10::cuda::CUDAStream& side) {
  auto done = std::make_shared<at::cuda::CUDAEvent>();
  done->record(side);
  return done;
}

}  // namespace

CopyDone StartCopyToHost(const at::Tensor& src, const at::Tensor& host) {
  const c10::DeviceIndex index = src.device().index();
  c10::cuda::CUDAGuard device_guard(index);
  c10::cuda::CUDAStream side = SideStreamAfterCurrent(index);
  {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    host.copy_(src, /*non_blocking=*/true);
  }
  // src may be freed by forward before the copy ran: the allocator must not
  // hand its block to the compute stream until the side stream is past it.
  c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), side);
  return RecordDone(side);
}

bool CopyFinished(const CopyDone& done) {
  return done == nullptr || static_cast<at::cuda::CUDAEvent*>(done.get())->query();
}

void WaitCopy(const CopyDone& done) {
  if (done != nullptr) static_cast<at::cuda::CUDAEvent*>(done.get())->synchronize();
}

CopyDone StartCopiesToDevice(const std::vector<HostToDevice>& copies) {
  if (copies.empty()) return nullptr;
  const c10::DeviceIndex index = copies.front().dst.device().index();
  for (const HostToDevice& copy : copies) {
    // One side stream and one completion event serve the whole batch.
    TORCH_CHECK(copy.dst.device().index() == index,
                "StartCopiesToDevice: destinations on several devices (internal error)");
  }
  c10::cuda::CUDAGuard device_guard(index);
  c10::cuda::CUDAStream side = SideStreamAfterCurrent(index);
  {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    // Pinned source + non_blocking: the caching host allocator records an
    // event on the side stream, so the caller may drop `host` at once.
    for (const HostToDevice& copy : copies)
      copy.dst.copy_(copy.host, /*non_blocking=*/true);
  }
  for (const HostToDevice& copy : copies) {
    c10::cuda::CUDACachingAllocator::recordStream(copy.dst.storage().data_ptr(), side);
  }
  return RecordDone(side);
}

void UseOnCurrentStream(const CopyDone& done, const at::Tensor& buffer) {
  if (done == nullptr) return;
  const c10::DeviceIndex index = buffer.device().index();
  c10::cuda::CUDAGuard device_guard(index);
  c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(index);
  static_cast<at::cuda::CUDAEvent*>(done.get())->block(current);
  c10::cuda::CUDACachingAllocator::recordStream(buffer.storage().data_ptr(), current);
}

#else  // !MEMPROFD_WITH_CUDA

namespace {
[[noreturn]] void NoCuda() {
  TORCH_CHECK(false,
              "memprofd was built without CUDA code paths (MEMPROFD_CUDA=OFF "
              "or a CPU-only LibTorch)");
}
}  // namespace

bool DeviceCopyHasCuda() { return false; }
at::Tensor EmptyPinned(int64_t) { NoCuda(); }
CopyDone StartCopyToHost(const at::Tensor&, const at::Tensor&) { NoCuda(); }
bool CopyFinished(const CopyDone& done) { return done == nullptr; }
void WaitCopy(const CopyDone&) {}
CopyDone StartCopiesToDevice(const std::vector<HostToDevice>& copies) {
  if (copies.empty()) return nullptr;
  NoCuda();
}
void UseOnCurrentStream(const CopyDone& done, const at::Tensor&) {
  if (done != nullptr) NoCuda();
}

#endif  // MEMPROFD_WITH_CUDA

}  // namespace memprofd::offload::internal
