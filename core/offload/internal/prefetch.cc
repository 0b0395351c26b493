// SavedTensorStore's backward read-ahead: which records to bring back before
// backward asks for them (SchedulePrefetch), the reader thread that loads them
// (ReaderLoop), and stopping it at the end of backward (QuiesceReader).

#include <exception>
#include <memory>
#include <utility>

#include "core/common/threads.h"
#include "core/offload/internal/saved_tensor_store.h"

namespace memprofd::offload::internal {

void SavedTensorStore::SchedulePrefetch(
    const StorageRecord& current, RecordsToReleaseUnlocked* to_release,
    std::vector<std::shared_ptr<StorageRecord>>* load_now) {
  const int depth = prefetch_depth_;
  if (depth == 0 || stopping_ || current.sequence_ < 0 || current.step_id_ != step_id_) {
    return;
  }
  // Backward runs forward's order in reverse: the records offloaded just
  // before this one are the next to be unpacked. Released ones (their nodes
  // already ran) are skipped; the live ones, loaded or not, count towards
  // the depth, which bounds the buffers brought back ahead of need.
  int ahead = 0;
  bool queued = false;
  for (int64_t i = current.sequence_ - 1; i >= 0 && ahead < depth; --i) {
    std::shared_ptr<StorageRecord> record = forward_order_[static_cast<size_t>(i)].lock();
    if (record == nullptr) continue;
    ++ahead;
    if (!record->prefetch_queued_ && !record->reloaded_.defined()) {
      record->prefetch_queued_ = true;
      if (compute_.is_meta()) {
        load_now->push_back(record);
      } else {
        prefetch_queue_.push_back(record);
        queued = true;
      }
    }
    to_release->push_back(std::move(record));
  }
  if (queued && !reader_.joinable())
    reader_ = std::thread(&SavedTensorStore::ReaderLoop, this);
}

void SavedTensorStore::ReaderLoop() {
  NameThisThread("mpd-offload-rd");
  while (true) {
    std::shared_ptr<StorageRecord> record;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SavedTensorStore::ReaderHasWork));
      if (stopping_) return;
      record = prefetch_queue_.front().lock();
      prefetch_queue_.pop_front();
      if (record == nullptr) continue;  // its graph was released while queued
      reader_busy_ = true;
    }
    try {
      record->Load(/*prefetch=*/true);
    } catch (const std::exception&) {
      // Not cached: the unpack that needs this record loads it again and
      // reports the error to autograd.
    }
    record.reset();  // maybe the last reference: its destructor takes mu_
    absl::MutexLock lock(&mu_);
    reader_busy_ = false;
  }
}

void SavedTensorStore::QuiesceReader() {
  prefetch_queue_.clear();
  mu_.Await(absl::Condition(this, &SavedTensorStore::ReaderIdle));
}

}  // namespace memprofd::offload::internal
