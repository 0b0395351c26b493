// RankCoordinator's view of the ranks' memory (rank_coordinator.h): each
// follower publishes its own about once a second (FollowerLoop), rank 0's
// reader thread collects them, and MemoryOfAllRanks reports them with their
// age and the imbalance between ranks.

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/threads.h"
#include "core/dist/process_group.h"
#include "core/memory/recorder.h"
#include "core/session/rank_coordinator.h"
#include "core/session/rank_messages.h"
#include "core/session/session_counters.h"

namespace memprofd {

using rank_messages::kRankMemoryPoll;
using rank_messages::MemoryKey;
using rank_messages::RankMemoryFromJson;

RankMemory RankCoordinator::OwnRankMemory() const {
  RankMemory m;
  m.rank = world_.rank;
  m.node_rank = world_.node_rank;
  m.device = device_;
  const memory::MemoryStatsView stats = recorder_.Stats();
  for (const auto& d : stats.devices) {
    if (d.name != device_) continue;
    m.current_bytes = d.current_bytes;
    m.peak_bytes = d.peak_bytes;
  }
  for (const auto& p : stats.last_step_peaks) {
    if (p.device == device_) m.last_step_peak_bytes = p.peak_bytes;
  }
  m.steps_total = counters_.Read().steps_total;
  return m;
}

absl::StatusOr<MemoryAcrossRanks> RankCoordinator::MemoryOfAllRanks() const {
  RETURN_IF_ERROR(CheckLeader("GetMemoryStats with all_ranks"));
  MemoryAcrossRanks all;
  all.ranks.push_back(OwnRankMemory());
  std::vector<absl::StatusOr<std::optional<std::string>>> published;
  {
    absl::MutexLock lock(&mu_);
    published = follower_memory_;
  }
  for (int r = 1; r < world_.world_size; ++r) {
    // Each follower publishes about once a second; one that never has (it
    // is still starting) is reported as such, not waited for.
    const absl::StatusOr<std::optional<std::string>> text =
        static_cast<size_t>(r - 1) < published.size()
            ? published[static_cast<size_t>(r - 1)]
            : absl::StatusOr<std::optional<std::string>>(std::nullopt);
    if (text.ok() && text->has_value()) {
      all.ranks.push_back(RankMemoryFromJson(r, **text));
    } else {
      RankMemory missing;
      missing.rank = r;
      missing.ok = false;
      missing.error =
          text.ok() ? absl::StrCat("rank ", r, " has not published its memory yet")
                    : absl::StrCat("rank ", r,
                                   "'s memory cannot be read: ", text.status().message());
      all.ranks.push_back(std::move(missing));
    }
  }
  bool first = true;
  int64_t peak_low = 0, peak_high = 0, now_low = 0, now_high = 0;
  for (const RankMemory& m : all.ranks) {
    if (!m.ok) continue;
    if (first) {
      peak_low = peak_high = m.last_step_peak_bytes;
      now_low = now_high = m.current_bytes;
      first = false;
    }
    peak_low = std::min(peak_low, m.last_step_peak_bytes);
    peak_high = std::max(peak_high, m.last_step_peak_bytes);
    now_low = std::min(now_low, m.current_bytes);
    now_high = std::max(now_high, m.current_bytes);
  }
  all.step_peak_imbalance_bytes = peak_high - peak_low;
  all.current_imbalance_bytes = now_high - now_low;
  return all;
}

void RankCoordinator::RankMemoryReaderLoop() {
  NameAndLowerThisThread("mpd-rank-memory", 0);
  for (;;) {
    std::vector<absl::StatusOr<std::optional<std::string>>> read;
    for (int r = 1; r < world_.world_size && memory_channel_; ++r) {
      read.push_back(memory_channel_->GetKeyIfSet(MemoryKey(r)));
    }
    absl::MutexLock lock(&mu_);
    follower_memory_ = std::move(read);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), kRankMemoryPoll);
    if (stopping_) return;
  }
}

}  // namespace memprofd
