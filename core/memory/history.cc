#include "core/memory/history.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace memprofd {
namespace memory {

absl::Status HistoryRing::Start(int64_t max_entries) {
  if (max_entries < 1 || max_entries > kMaxEntriesLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("history max_entries must be in [1, ", kMaxEntriesLimit, "], got ",
                     max_entries, "; 100000 keeps a few steps of a small model"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t old_max = static_cast<int64_t>(ring_.size());
  if (old_max != max_entries) {
    // Keep the newest entries that fit, oldest first.
    const int64_t held = std::min(next_, old_max);
    const int64_t keep = std::min(held, max_entries);
    std::vector<HistoryEntry> ring(static_cast<size_t>(max_entries));
    for (int64_t i = 0; i < keep; ++i) {
      const int64_t src = (next_ - keep + i) % old_max;
      ring[static_cast<size_t>(i)] = ring_[static_cast<size_t>(src)];
    }
    ring_ = std::move(ring);
    // Everything appended but not kept counts as dropped.
    dropped_extra_ += next_ - keep;
    next_ = keep;
  }
  recording_ = true;
  return absl::OkStatus();
}

void HistoryRing::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  recording_ = false;
}

void HistoryRing::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  next_ = 0;
  dropped_extra_ = 0;
}

void HistoryRing::Append(const HistoryEntry& entry) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!recording_) return;
  ring_[static_cast<size_t>(next_ % static_cast<int64_t>(ring_.size()))] = entry;
  ++next_;
}

HistorySnapshot HistoryRing::Copy(bool include_entries) const {
  HistorySnapshot snap;
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t max = static_cast<int64_t>(ring_.size());
  const int64_t held = std::min(next_, max);
  if (include_entries) {
    snap.entries.reserve(static_cast<size_t>(held));
    for (int64_t i = next_ - held; i < next_; ++i) {
      snap.entries.push_back(ring_[static_cast<size_t>(i % max)]);
    }
  }
  snap.size = held;
  snap.max_entries = max;
  snap.dropped = next_ - held + dropped_extra_;
  snap.recording = recording_;
  return snap;
}

int64_t HistoryRing::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::min(next_, static_cast<int64_t>(ring_.size()));
}

int64_t HistoryRing::max_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(ring_.size());
}

int64_t HistoryRing::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_ - std::min(next_, static_cast<int64_t>(ring_.size())) + dropped_extra_;
}

bool HistoryRing::recording() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recording_;
}

}  // namespace memory
}  // namespace memprofd
