#ifndef MEMPROFD_CORE_COMMON_HOST_HEAP_H_
#define MEMPROFD_CORE_COMMON_HOST_HEAP_H_

// The process's heap on the host (glibc malloc) and its resident set.
//
// With the CPU as compute device every tensor is a malloc'd block. glibc's
// defaults keep much of what a step frees: its mmap threshold starts at 128
// KiB but rises to the size of each large block freed (up to 32 MiB), after
// which blocks of that size come from the heap's arenas, and a freed arena
// chunk goes back to the kernel only when it sits at the arena's top. So a
// training step's RSS grows well past the allocator's live bytes and stays
// there, and Kubernetes, which kills pods by RSS, sees a process several
// times larger than its plan (docs/operating.md#host-memory gives figures).
//
// KeepHostHeapNearLiveBytes fixes the threshold at kHostMmapThreshold (a
// fixed threshold no longer rises), so every block that size or larger is
// its own mapping, given back to the kernel when freed, and lowers the trim
// threshold to the same, so an arena's free top goes back too.
// ReturnFreedHostMemory gives back the free pages inside the arenas as well
// (malloc_trim), for the step boundaries.

#include <cstdint>

namespace memprofd {

// Blocks of this many bytes or more are mapped on their own once
// KeepHostHeapNearLiveBytes has run: glibc's initial threshold.
inline constexpr int64_t kHostMmapThreshold = 128 << 10;

// The resident bytes a tensor storage of `bytes` costs on the host heap once
// written, with KeepHostHeapNearLiveBytes in effect: a block of about
// kHostMmapThreshold or more is a mapping of its own, rounded up to whole
// pages with malloc's header and LibTorch's 64-byte alignment
// (posix_memalign); a smaller one its size and header, inside an arena.
// 0 for 0 bytes.
int64_t HostHeapFootprint(int64_t bytes);

// Sets the mmap and trim thresholds (above) for this process. Idempotent;
// false when glibc refuses (nothing changes then).
bool KeepHostHeapNearLiveBytes();

// Gives the arenas' free pages back to the kernel (malloc_trim(0)); cheap
// next to a training step.
void ReturnFreedHostMemory();

// What the kernel counts as resident for this process, from
// /proc/self/status: VmRSS now and VmHWM, its peak since the process began
// or since ResetHostPeakResident. -1 where unknown.
struct HostResident {
  int64_t rss_bytes = -1;
  int64_t peak_rss_bytes = -1;
};
HostResident ReadHostResident();

// Restarts VmHWM from the present RSS (writes 5 to /proc/self/clear_refs,
// Linux 4.0 and later); false when the kernel refuses.
bool ResetHostPeakResident();

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_HOST_HEAP_H_
