#ifndef MEMPROFD_CORE_MEMORY_CUDA_STATS_H_
#define MEMPROFD_CORE_MEMORY_CUDA_STATS_H_

// CUDA caching allocator statistics and history, through the allocator's own
// API (LibTorch 2.6 and later). Compiled only with MEMPROFD_WITH_CUDA. No
// LibTorch in this header.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "core/common/attribution.h"
#include "core/memory/history.h"
#include "core/memory/memory_viz.h"

namespace memprofd {
namespace memory {

// One device's caching allocator counters ("all" pools).
struct CudaDeviceSample {
  int device = 0;
  int64_t allocated_bytes = 0;       // Of the blocks handed out (rounded sizes).
  int64_t peak_allocated_bytes = 0;  // Since the last ResetCudaPeaks().
  // The sizes those blocks were requested at: what AttachCudaAccounting's
  // cells add up to.
  int64_t requested_bytes = 0;
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

// cudaMemGetInfo for `device`: the driver's free and total bytes. false
// when CUDA fails (no such device). Initialises CUDA on that device if
// nothing did yet. Thread-safe.
bool CudaMemInfo(int device, int64_t* free_bytes, int64_t* total_bytes);

// The device memory limit (the daemon's --device_memory_limit) on `device`:
// the caching allocator may then reserve at most `bytes` there (its memory
// fraction, bytes / the device's total), and an allocation beyond that fails
// with its OutOfMemoryError and the OOM observer's report, as on a device
// that size. Initialises CUDA. FAILED_PRECONDITION for a device that is not
// there; INVALID_ARGUMENT when `bytes` exceeds the device's total. 0: back
// to no limit (fraction 1). CudaMemoryLimit: the limit set on `device`, 0 for
// none.
absl::Status SetCudaMemoryLimit(int device, int64_t bytes);
int64_t CudaMemoryLimit(int device);

// Resets the peaks of every initialised device to their current values.
void ResetCudaPeaks();

// Gives the caching allocator's unused cached segments back to the driver
// (torch.cuda.empty_cache), so that what it reserves next starts from what
// is in use. Thread-safe; nothing without an initialised allocator.
void EmptyCudaCache();

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

// Attribution of CUDA blocks, as the counting CPU allocator does for CPU
// ones (cpu_allocator.h). Attaches memprofd's trace tracker to the caching
// allocator, initialising CUDA first (the allocator hands trackers only to
// the devices it has set up). From then on each block the allocator hands
// out, on any thread, is attributed to that thread's CurrentAttribution() and
// counted in the global recorder's cells of its device
// (MemoryRecorder::RecordAttributedAlloc) at its requested size, until its
// free is requested. The device's totals and history stay the allocator's
// own. The tracker runs under the allocator's per-device lock and takes
// only a lock of its own, never one that is held while calling the
// allocator. Blocks live before the call are not attributed: the session
// attaches before it loads the model. Idempotent and thread-safe.
// FAILED_PRECONDITION without a CUDA device; INTERNAL when CUDA fails to
// initialise.
absl::Status AttachCudaAccounting();

// Whether AttachCudaAccounting() succeeded.
bool IsCudaAccountingAttached();

// The attribution of the live block at `addr` (a storage's data pointer) on
// CUDA `device`, or nullopt when the tracker did not see it allocated.
// Thread-safe, O(1).
std::optional<Attribution> CudaBlockAttribution(int device, uint64_t addr);

// Re-attributes that block to `module` and `category` (the recorder's cells
// move with it); false when the tracker did not see it. The caller holds the
// storage. Thread-safe, O(1).
bool RetagCudaBlock(int device, uint64_t addr, ModuleId module, Category category);

// The live blocks the tracker saw allocated (device, address, requested
// size, attribution), in no particular order. Thread-safe; O(live blocks).
std::vector<LiveBlock> LiveCudaBlocks();

// The allocator's segments (all versions; none before CUDA is initialised)
// and traces (>= 2.1: the kept ones, then the allocator's current ones), for
// the memory_viz pickle. Thread-safe.
CudaAllocatorSnapshot CaptureCudaSnapshot();

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_CUDA_STATS_H_
