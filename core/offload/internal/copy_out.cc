// SavedTensorStore's copies off the compute device: CUDA copies to pinned
// host memory on a side stream, retired as they finish, and blocks for the
// spill file, written by the writer thread (WriterLoop) from a bounded queue.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <utility>

#include "core/common/threads.h"
#include "core/offload/internal/saved_tensor_store.h"

namespace memprofd::offload::internal {

void SavedTensorStore::StartCopy(const std::shared_ptr<StorageRecord>& record,
                                 size_t index, const c10::Storage& storage,
                                 RecordsToReleaseUnlocked* to_release) {
  // Everything that can throw (allocations, CUDA calls) runs before the
  // record counts the copy as pending, so a failed pack leaves it consistent.
  const ByteSpan span = record->segments_[index].span;
  if (record->device_.is_meta()) {
    // A dry run: the copy is counted, not made. Done at once (the record no
    // longer holds the storage, as after a finished copy), or held in
    // flight with its source as a copy to host is, retired by the same rule.
    if (record->pending_++ == 0) AddResident(record->storage_nbytes_);
    if (!meta_copies_in_flight_) {
      FinishCopy(record.get(), index, "");
      return;
    }
    record->segments_[index].meta_source = storage;
    copies_to_host_.push_back(CopyToHost{record, index});
    RetireCopiesToHost(CopyWait::kOverLimit, to_release);
    return;
  }
  at::Tensor source;  // kByte view of the span, for device copies
  if (!record->device_.is_cpu()) {
    source = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(record->device_));
    source.set_(storage, span.begin, {span.size()}, {1});
  }
  const bool to_host =
      options_.target == Target::kHost &&
      (options_.host_limit_bytes == 0 ||
       host_held_ + span.size() <= options_.host_limit_bytes || spill_ == nullptr);
  if (to_host) {
    // Only CUDA sources get here (a CPU source with the host target is on
    // target already).
    at::Tensor host = EmptyPinned(span.size());
    CopyDone done = StartCopyToHost(source, host);
    Segment& segment = record->segments_[index];
    segment.host = std::move(host);
    segment.cuda_done = std::move(done);
    host_held_ += span.size();
    if (record->pending_++ == 0) AddResident(record->storage_nbytes_);
    copies_to_host_.push_back(CopyToHost{record, index});
    RetireCopiesToHost(CopyWait::kOverLimit, to_release);
    return;
  }
  WriteJob job;
  job.record = record;
  job.segment = index;
  job.bytes = span.size();
  if (source.defined()) {
    job.staging = EmptyPinned(span.size());
    job.done = StartCopyToHost(source, job.staging);
  } else {
    job.source = storage;
    ++record->source_refs_;
    job.data = static_cast<const char*>(storage.data()) + span.begin;
  }
  job.file_offset = spill_->Allocate(span.size());
  record->segments_[index].file_offset = job.file_offset;
  if (record->pending_++ == 0) AddResident(record->storage_nbytes_);
  if (!writer_running_ || stopping_) {
    // No writer (after Shutdown): write inline.
    WaitCopy(job.done);
    const absl::Status status = spill_->Write(
        job.file_offset, job.staging.defined() ? job.staging.data_ptr() : job.data,
        job.bytes);
    if (job.source) --record->source_refs_;
    job.source = c10::Storage();
    FinishCopy(record.get(), index, status.ok() ? "" : status.ToString());
    return;
  }
  // Bounded queue: the sources of queued blocks stay resident.
  mu_.Await(absl::Condition(this, &SavedTensorStore::WriterHasRoom));
  ++writes_in_flight_;
  write_queue_.push_back(std::move(job));
}

void SavedTensorStore::RetireCopiesToHost(CopyWait wait,
                                          RecordsToReleaseUnlocked* to_release) {
  while (!copies_to_host_.empty()) {
    CopyToHost& front = copies_to_host_.front();
    Segment& segment = front.record->segments_[front.segment];
    const bool over =
        static_cast<int>(copies_to_host_.size()) > options_.max_copies_in_flight;
    const bool meta = static_cast<bool>(segment.meta_source);
    if (meta || !CopyFinished(segment.cuda_done)) {
      if (wait != CopyWait::kAll && !over) break;
      if (!meta) WaitCopy(segment.cuda_done);
    }
    segment.cuda_done = nullptr;
    segment.meta_source = c10::Storage();
    FinishCopy(front.record.get(), front.segment, "");
    to_release->push_back(std::move(front.record));
    copies_to_host_.pop_front();
  }
}

void SavedTensorStore::FinishCopy(StorageRecord* record, size_t index,
                                  const std::string& error) {
  Segment& segment = record->segments_[index];
  segment.error = error;
  if (--record->pending_ == 0) AddResident(-record->storage_nbytes_);
}

void SavedTensorStore::WriterLoop() {
  NameThisThread("mpd-offload-wr");
  while (true) {
    WriteJob job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &SavedTensorStore::WriterHasWork));
      if (write_queue_.empty()) {
        writer_running_ = false;
        return;
      }
      job = std::move(write_queue_.front());
      write_queue_.pop_front();
    }
    WaitCopy(job.done);
    const absl::Status status = spill_->Write(
        job.file_offset, job.staging.defined() ? job.staging.data_ptr() : job.data,
        job.bytes);
    job.staging.reset();
    {
      absl::MutexLock lock(&mu_);
      // Release the source before the copy counts as finished (Flush()
      // returning means the device bytes are free), and under mu_ with its
      // count, so that DecideEffectiveness sees both or neither.
      if (job.source) --job.record->source_refs_;
      job.source = c10::Storage();
      FinishCopy(job.record.get(), job.segment, status.ok() ? "" : status.ToString());
    }
    // Maybe the last reference to the record (its destructor takes mu_): it
    // goes before the job counts as done, so that once Flush() returns the
    // writer keeps no released graph's record alive.
    job.record.reset();
    absl::MutexLock lock(&mu_);
    --writes_in_flight_;
  }
}

}  // namespace memprofd::offload::internal
