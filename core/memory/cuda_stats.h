#ifndef MEMPROFD_CORE_MEMORY_CUDA_STATS_H_
#define MEMPROFD_CORE_MEMORY_CUDA_STATS_H_

// CUDA caching allocator statistics and history, through the allocator's own
// API (LibTorch 2.6 and later). Compiled only with MEMPROFD_WITH_CUDA. No
// LibTorch in this header.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/memory/memory_viz.h"

namespace memprofd {
namespace memory {

// One device's caching allocator counters ("all" pools).
struct CudaDeviceSample {
  int device = 0;
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;  // Since the last ResetCudaPeaks().
  int64_t reserved_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t active_bytes = 0;
  int64_t peak_active_bytes = 0;
  int64_t alloc_retries = 0;
  int64_t ooms = 0;
  int64_t alloc_count = 0;  // allocation.all.allocated / .freed
  int64_t free_count = 0;
};

// Number of CUDA devices visible (0 when none or CUDA fails to initialise).
int CudaDeviceCount();

// Every device whose allocator is initialised; empty without CUDA devices or
// before the first CUDA allocation. Thread-safe (the allocator locks).
std::vector<CudaDeviceSample> SampleCudaDevices();

// Resets the peaks of every initialised device to their current values.
void ResetCudaPeaks();

// Turns the allocator's own trace recording on or off, keeping up to
// max_entries (at least 1) per device. What was recorded stays, for
// CaptureCudaSnapshot(), until ClearCudaHistory(), although the allocator
// drops its own trace when recording is turned off; turning it on again
// continues the history. Turning it on initialises CUDA if nothing did yet
// (as torch.cuda.memory._record_memory_history does): the allocator records
// only on devices it has set up. UNIMPLEMENTED before LibTorch 2.1 (or for a
// recordHistory signature this file does not know), where only segments are
// dumped; FAILED_PRECONDITION without a CUDA device; INTERNAL when CUDA or the
// allocator refuses (the cudaMallocAsync backend keeps no history).
// Thread-safe.
absl::Status SetCudaHistory(bool enabled, int64_t max_entries);

// Drops what SetCudaHistory() kept and the allocator's current trace;
// recording, if on, goes on. Thread-safe.
void ClearCudaHistory();

// The allocator's segments (all versions; none before CUDA is initialised)
// and traces (>= 2.1: the kept ones, then the allocator's current ones), for
// the memory_viz pickle. Thread-safe.
CudaAllocatorSnapshot CaptureCudaSnapshot();

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_CUDA_STATS_H_
