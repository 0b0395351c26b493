#include "core/memory/history.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace memprofd {
namespace memory {

static_assert(sizeof(HistoryEntry) % sizeof(uint64_t) == 0, "entry must be whole words");

HistoryRing::~HistoryRing() = default;

void HistoryRing::WriteSlot(Buffer& b, int64_t index, const HistoryEntry& e) {
  Slot& s = b.slots[static_cast<size_t>(index % b.size)];
  uint64_t words[kWords];
  std::memcpy(words, &e, sizeof(e));
  s.stamp.store(2 * static_cast<uint64_t>(index) + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (int w = 0; w < kWords; ++w) s.words[w].store(words[w], std::memory_order_relaxed);
  s.stamp.store(2 * static_cast<uint64_t>(index) + 2, std::memory_order_release);
}

bool HistoryRing::ReadSlot(const Buffer& b, int64_t index, HistoryEntry* out) const {
  const Slot& s = b.slots[static_cast<size_t>(index % b.size)];
  const uint64_t want = 2 * static_cast<uint64_t>(index) + 2;
  if (s.stamp.load(std::memory_order_acquire) != want) return false;
  uint64_t words[kWords];
  for (int w = 0; w < kWords; ++w) words[w] = s.words[w].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s.stamp.load(std::memory_order_relaxed) != want) return false;
  std::memcpy(out, words, sizeof(*out));
  return true;
}

int64_t HistoryRing::FirstHeld(int64_t next) const {
  const Buffer* b = buffer_.load(std::memory_order_relaxed);
  const int64_t size = b ? b->size : 0;
  return std::max({cleared_at_, valid_from_, next - size});
}

absl::Status HistoryRing::Start(int64_t max_entries) {
  if (max_entries < 1 || max_entries > kMaxEntriesLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("history max_entries must be in [1, ", kMaxEntriesLimit, "], got ",
                     max_entries, "; 100000 keeps a few steps of a small model"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  Buffer* old = buffer_.load(std::memory_order_relaxed);
  if (old == nullptr || old->size != max_entries) {
    auto fresh = std::make_unique<Buffer>(max_entries);
    // Keep the newest entries that fit, at their absolute indices.
    const int64_t next = next_.load(std::memory_order_acquire);
    int64_t kept_from = next;
    if (old != nullptr) {
      const int64_t first = std::max(FirstHeld(next), next - max_entries);
      for (int64_t i = next - 1; i >= first; --i) {
        HistoryEntry e;
        if (!ReadSlot(*old, i, &e)) break;
        WriteSlot(*fresh, i, e);
        kept_from = i;
      }
    }
    valid_from_ = kept_from;
    buffer_.store(fresh.get(), std::memory_order_release);
    buffers_.push_back(std::move(fresh));
  }
  recording_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

void HistoryRing::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  recording_.store(false, std::memory_order_release);
}

void HistoryRing::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  cleared_at_ = next_.load(std::memory_order_acquire);
  valid_from_ = cleared_at_;
}

void HistoryRing::Append(const HistoryEntry& entry) {
  if (!recording_.load(std::memory_order_acquire)) return;
  Buffer* b = buffer_.load(std::memory_order_acquire);
  if (b == nullptr) return;
  WriteSlot(*b, next_.fetch_add(1, std::memory_order_acq_rel), entry);
}

HistorySnapshot HistoryRing::Copy(bool include_entries) const {
  HistorySnapshot snap;
  std::lock_guard<std::mutex> lock(mu_);
  const Buffer* b = buffer_.load(std::memory_order_relaxed);
  const int64_t next = next_.load(std::memory_order_acquire);
  const int64_t first = FirstHeld(next);
  if (include_entries && b != nullptr) {
    snap.entries.reserve(static_cast<size_t>(next - first));
    for (int64_t i = first; i < next; ++i) {
      HistoryEntry e;
      if (ReadSlot(*b, i, &e)) snap.entries.push_back(e);
    }
    snap.size = static_cast<int64_t>(snap.entries.size());
  } else {
    snap.size = next - first;
  }
  snap.max_entries = b ? b->size : 0;
  snap.dropped = (next - cleared_at_) - (next - first);
  snap.recording = recording_.load(std::memory_order_relaxed);
  return snap;
}

int64_t HistoryRing::size() const { return Copy(/*include_entries=*/false).size; }

int64_t HistoryRing::max_entries() const {
  return Copy(/*include_entries=*/false).max_entries;
}

int64_t HistoryRing::dropped() const { return Copy(/*include_entries=*/false).dropped; }

bool HistoryRing::recording() const { return recording_.load(std::memory_order_acquire); }

}  // namespace memory
}  // namespace memprofd
