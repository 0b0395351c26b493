#ifndef MEMPROFD_CORE_MEMORY_MEMORY_VIZ_H_
#define MEMPROFD_CORE_MEMORY_MEMORY_VIZ_H_

// The memory history as a PyTorch memory snapshot pickle (the format of
// torch.cuda.memory._snapshot(), read by pytorch.org/memory_viz and by
// torch.cuda._memory_viz): a dict with "segments", "device_traces" (one list
// per device) and "allocator_settings". Protocol 2, plain dicts, lists,
// strings, ints, floats and bools only, so Python's pickle.load reads it
// without torch. No LibTorch in this header.
//
// Devices are numbered as PyTorch's _profile_to_snapshot() does: CUDA
// devices 0..n-1, then CPU memory as device n (0 without CUDA).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/common/attribution.h"
#include "core/memory/history.h"

namespace memprofd {
namespace memory {

class MemoryRecorder;

enum class VizBlockState { kActiveAllocated, kActivePendingFree, kInactive };
enum class VizAction {
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree
};

struct VizBlock {
  int64_t size = 0;
  int64_t requested_size = 0;
  VizBlockState state = VizBlockState::kInactive;
  // memprofd's context when the allocator kept one (CUDA history on).
  std::optional<Attribution> origin;
};

// Blocks tile the segment: their sizes sum to total_size, in address order.
struct VizSegment {
  int device = 0;
  uint64_t address = 0;
  int64_t total_size = 0;
  int64_t stream = 0;
  std::vector<VizBlock> blocks;
};

struct VizTraceEntry {
  VizAction action = VizAction::kAlloc;
  uint64_t addr = 0;
  int64_t size = 0;
  int64_t time_us = 0;
  // memprofd's context recorded with the entry (CUDA history on); nullopt:
  // the viewer shows category "unknown" and no frames.
  std::optional<Attribution> origin;
};

// What the CUDA caching allocator reports about itself (cuda_stats.h).
struct CudaAllocatorSnapshot {
  std::vector<VizSegment> segments;
  std::vector<std::vector<VizTraceEntry>> device_traces;  // Index = CUDA ordinal.
};

struct MemoryVizInput {
  // The recorder's history, oldest first (HistorySnapshot::entries).
  std::vector<HistoryEntry> history;
  // CPU allocations alive at dump time (LiveCpuBlocks()).
  std::vector<LiveBlock> live_blocks;
  CudaAllocatorSnapshot cuda;
  int num_cuda_devices = 0;
  // The ring's state, written to allocator_settings.
  int64_t history_max_entries = 0;
  int64_t history_dropped = 0;
  bool recording = false;
};

// Builds the pickle. Every trace alloc/free is on its device's trace; a
// recorder event becomes "alloc", or "free_requested" directly followed by
// "free_completed" (which the viewer merges into one free). Each carries its
// `category` (the block's final one: an alloc takes the category its block
// had when freed, or has now, so that a storage autograd saved shows as
// saved_activations) and two frames: {filename: module path, line: 0, name:
// op} and {filename: "memprofd", line: step, name: "<phase> step <step>"}.
// The CPU allocator has no cache, so each CPU block is its own segment: a
// CPU alloc is preceded by its "segment_alloc" and a free followed by its
// "segment_free", and the CPU segments of the dump are exactly the live
// blocks (reserved == allocated). The live set is first made consistent with
// the trace (an address whose last event is an alloc is live, one whose
// last event is a free is not), so allocs and frees pair whatever raced with
// the dump. Each device trace with categories ends with a "snapshot" marker
// of category "unknown" (MemoryViz.js's `categores` typo throws unless some
// event is "unknown"). allocator_settings names the devices ("device_names",
// CPU last) and the ring (history_max_entries, history_entries,
// history_dropped, recording). Never fails.
std::string BuildMemoryVizPickle(const MemoryVizInput& input);

// Collects the live CPU blocks, then `recorder`'s history (in that order: the
// history is the newer of the two), then the CUDA allocator's snapshot when
// built with CUDA, and builds the pickle. Thread-safe; O(live blocks +
// history entries); does not stop recording.
std::string CaptureMemoryVizPickle(const MemoryRecorder& recorder);

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_MEMORY_VIZ_H_
