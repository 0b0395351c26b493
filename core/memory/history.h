#ifndef MEMPROFD_CORE_MEMORY_HISTORY_H_
#define MEMPROFD_CORE_MEMORY_HISTORY_H_

// The memory history: a bounded ring of allocation and free events. No
// LibTorch.

#include <cstddef>
#include <cstdint>
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

// Keeps exactly the newest max_entries events; memory is allocated once, at
// Start(), so it is bounded whatever the run length.
// Thread-safe: Append() may be called from any thread (one short critical
// section per event); the other methods from any thread too.
class HistoryRing {
 public:
  // Largest accepted max_entries (400 MB of entries; the viewer stalls well
  // before that).
  static constexpr int64_t kMaxEntriesLimit = 10'000'000;

  HistoryRing() = default;
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

  // Appends when recording (checked under the lock, so no event lands after
  // Stop() returns).
  void Append(const HistoryEntry& entry);

  // The entries (unless include_entries is false) and the counters.
  HistorySnapshot Copy(bool include_entries = true) const;
  int64_t size() const;
  int64_t max_entries() const;
  int64_t dropped() const;
  bool recording() const;

 private:
  // std::mutex rather than absl::Mutex: on Debian 12's Abseil an uncontended
  // lock+unlock measured 54 ns for absl::Mutex and 6 ns for std::mutex, and
  // this lock is taken once per recorded event.
  mutable std::mutex mu_;
  // All guarded by mu_.
  std::vector<HistoryEntry> ring_;  // size() == max_entries
  int64_t next_ = 0;                // Total appended since Clear().
  int64_t dropped_extra_ = 0;       // Dropped by a resize in Start().
  bool recording_ = false;
};

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_HISTORY_H_
