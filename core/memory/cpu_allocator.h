#ifndef MEMPROFD_CORE_MEMORY_CPU_ALLOCATOR_H_
#define MEMPROFD_CORE_MEMORY_CPU_ALLOCATOR_H_

// A counting wrapper around LibTorch's CPU allocator. Every CPU tensor storage
// allocated after installation, on any thread (OpenMP workers and autograd
// threads included), is reported to MemoryRecorder::Global() at O(1) cost per
// event: the allocation carries a 64-byte header in front of the data that
// remembers its size, the original deleter and its place in a live-block list.
//
// Blind to what does not go through c10's CPU allocator: pinned memory,
// from_blob, mmap-ed storages, oneDNN scratch, third-party malloc. Storages
// allocated before installation are freed through their original deleter and
// never counted. The header is not included in the reported sizes. A failed
// allocation is told to NoteAllocationFailure (oom_report.h) before the
// exception goes on.

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "core/common/attribution.h"
#include "core/memory/history.h"

namespace memprofd {
namespace memory {

// c10::SetAllocator priority of the wrapper (LibTorch registers its default
// CPU allocator at 0; a later SetAllocator with a lower priority is ignored).
inline constexpr uint8_t kCountingCpuAllocatorPriority = 100;

// Wraps the CPU allocator registered now with the counting one. Call at
// process start, before any model tensor exists. Idempotent and thread-safe.
// FAILED_PRECONDITION when an allocator of higher priority holds the CPU slot
// (nothing would be counted).
absl::Status InstallCountingCpuAllocator();

// True once InstallCountingCpuAllocator() succeeded.
bool IsCountingCpuAllocatorInstalled();

// The attribution of the block whose DataPtr has data pointer `data` and
// deleter `deleter` (a storage's data_ptr().get() and get_deleter()), or
// nullopt when the wrapper did not allocate it. The caller must hold the
// storage. O(1).
std::optional<Attribution> CpuBlockAttribution(void* data, void (*deleter)(void*));

// Re-attributes such a block to `module` and `category` (the recorder's
// cells move with it); false when the wrapper did not allocate it. The caller
// must hold the storage; one thread at a time per block. O(1).
bool RetagCpuBlock(void* data, void (*deleter)(void*), ModuleId module,
                   Category category);

// The device memory limit of a daemon computing on the CPU (its
// --device_memory_limit): once set above 0, an allocation through the wrapper
// that would take the bytes it holds beyond `bytes` fails as one the memory
// cannot hold does (NoteAllocationFailure, then c10::OutOfMemoryError, which
// says "out of memory" and names the limit). On the CPU the compute device is
// the host, so every storage the wrapper allocates counts: the model's, the
// step's and the host-side copies alike. 0 (or below): no limit. Takes effect
// for the next allocation; the bytes held already stay. Process-wide;
// thread-safe.
void SetCpuMemoryLimit(int64_t bytes);
// The limit set (0: none), and the bytes the wrapper holds now (what the
// limit is checked against; storages allocated before installation are not
// among them).
int64_t CpuMemoryLimit();
int64_t CpuAllocatedBytes();
// The bytes the wrapper has allocated since installation, freed or not (for
// a probe that must see what an op allocates and frees inside itself).
int64_t CpuAllocatedBytesTotal();

// The CPU allocations made through the wrapper that are alive now (device
// kCpuDevice, data address, requested size, attribution), in no particular
// order.
// Thread-safe; costs O(live allocations) and briefly locks each of the
// wrapper's shards.
std::vector<LiveBlock> LiveCpuBlocks();

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_CPU_ALLOCATOR_H_
