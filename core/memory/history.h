#ifndef MEMPROFD_CORE_MEMORY_HISTORY_H_
#define MEMPROFD_CORE_MEMORY_HISTORY_H_

// The memory history: a bounded ring of allocation and free events. No
// LibTorch.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "core/common/attribution.h"
#include "core/common/phase.h"

namespace memprofd {
namespace memory {

// Device numbering inside core/memory: kCpuDevice for host memory seen by the
// CPU allocator wrapper, 0..n-1 for CUDA devices.
inline constexpr int kCpuDevice = -1;

enum class HistoryAction : uint8_t { kAlloc = 0, kFree = 1 };

// One event. 40 bytes. An alloc carries the attribution of the allocation;
// a free the phase and step at the free with the block's module, op and
// category (which a re-tag may have changed since the alloc).
struct HistoryEntry {
  uint64_t addr = 0;
  int64_t size = 0;
  int64_t time_us = 0;  // Unix epoch, microseconds (coarse clock, 1-4 ms steps).
  int64_t step = 0;     // CurrentStep() when the event happened.
  HistoryAction action = HistoryAction::kAlloc;
  int8_t device = kCpuDevice;
  Phase phase = Phase::kIdle;
  Category category = Category::kUnknown;
  ModuleId module = 0;
  OpId op = 0;
};
static_assert(sizeof(HistoryEntry) == 40, "HistoryEntry must stay 40 bytes");

// An allocation alive at the time it was listed.
struct LiveBlock {
  int device = kCpuDevice;
  uint64_t addr = 0;
  int64_t size = 0;
  Attribution origin;  // As allocated, with re-tags applied.
};

// A copy of the ring, oldest entry first.
struct HistorySnapshot {
  std::vector<HistoryEntry> entries;
  int64_t size = 0;  // Entries held (entries.size() when copied).
  int64_t max_entries = 0;
  int64_t dropped = 0;  // Entries overwritten since the last Clear().
  bool recording = false;
};

// Keeps exactly the newest max_entries events; memory is allocated at
// Start(), so it is bounded whatever the run length.
// Thread-safe. Append() takes no lock: it claims an index with one atomic
// add and writes its slot, stamped so that Copy() keeps only whole entries
// (threads recording at once would otherwise serialize on a mutex, which cost
// +132 ns per event at 2 threads). The other methods take a mutex among
// themselves. An Append() racing with Stop() may still land; one racing with
// a resizing Start() may be lost (and counted as dropped).
class HistoryRing {
 public:
  // Largest accepted max_entries (640 MB of slots; the viewer stalls well
  // before that).
  static constexpr int64_t kMaxEntriesLimit = 10'000'000;

  HistoryRing() = default;
  ~HistoryRing();
  HistoryRing(const HistoryRing&) = delete;
  HistoryRing& operator=(const HistoryRing&) = delete;

  // Starts (or continues) recording into a ring of `max_entries`. When the
  // ring already holds entries and the size changes, the newest entries that
  // fit are kept. INVALID_ARGUMENT unless 1 <= max_entries <= kMaxEntriesLimit.
  absl::Status Start(int64_t max_entries);
  // Stops recording; entries stay until Clear() (so they can still be dumped).
  void Stop();
  // Drops every entry and the dropped count; keeps recording state and size.
  void Clear();

  // Appends when recording.
  void Append(const HistoryEntry& entry);

  // The entries (unless include_entries is false) and the counters. Entries
  // being written at that moment are left out.
  HistorySnapshot Copy(bool include_entries = true) const;
  int64_t size() const;
  int64_t max_entries() const;
  int64_t dropped() const;
  bool recording() const;

 private:
  static constexpr int kWords = sizeof(HistoryEntry) / sizeof(uint64_t);
  // One entry as relaxed atomic words, and a stamp: 2 * index + 2 once the
  // entry of absolute index `index` is whole, odd while it is being written.
  // A cache line each: consecutive events come from different threads, and
  // slots sharing a line would bounce it between their cores at every write.
  struct alignas(64) Slot {
    std::atomic<uint64_t> stamp{0};
    std::atomic<uint64_t> words[kWords];
  };
  struct Buffer {
    explicit Buffer(int64_t n) : slots(new Slot[static_cast<size_t>(n)]), size(n) {}
    std::unique_ptr<Slot[]> slots;
    const int64_t size;
  };
  bool ReadSlot(const Buffer& b, int64_t index, HistoryEntry* out) const;
  void WriteSlot(Buffer& b, int64_t index, const HistoryEntry& e);
  // The oldest index held; call with mu_ held.
  int64_t FirstHeld(int64_t next) const;

  std::atomic<Buffer*> buffer_{nullptr};
  std::atomic<int64_t> next_{0};  // Absolute index of the next entry.
  std::atomic<bool> recording_{false};
  mutable std::mutex mu_;  // Start, Stop, Clear, Copy.
  // Guarded by mu_.
  std::vector<std::unique_ptr<Buffer>> buffers_;  // The current one last;
                                                  // older ones may still be
                                                  // written by a racing Append.
  int64_t cleared_at_ = 0;                        // next_ at the last Clear().
  int64_t valid_from_ = 0;  // Entries before this index were lost to a resize.
};

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_HISTORY_H_
