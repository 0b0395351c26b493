// The CUDA half of OOM reports: the caching allocator's OOM observer.
// Compiled only with MEMPROFD_WITH_CUDA (CMake adds it then).

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/memory/oom_report.h"

namespace memprofd {
namespace memory {

void InstallCudaOomObserver() {
  static std::mutex mu;
  static bool attached = false;
  std::lock_guard<std::mutex> lock(mu);
  if (attached) return;
  auto* allocator = c10::cuda::CUDACachingAllocator::get();
  // The native allocator hands the observer to its per-device allocators,
  // which exist only once it is initialised (CUDA's lazy init): attaching
  // before that would be lost, so wait for a later call.
  if (allocator == nullptr || !allocator->initialized()) return;
  // Called on the failing thread, after the allocator released its lock and
  // before it throws OutOfMemoryError: the live blocks are still there.
  allocator->attachOutOfMemoryObserver(
      [](int64_t device, size_t requested, size_t device_total, size_t device_free) {
        NoteAllocationFailure(static_cast<int>(device), static_cast<int64_t>(requested),
                              static_cast<int64_t>(device_free),
                              static_cast<int64_t>(device_total));
      });
  attached = true;
}

}  // namespace memory
}  // namespace memprofd
