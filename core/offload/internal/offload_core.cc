#include "core/offload/internal/offload_core.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace memprofd::offload::internal {

ByteSpan CoveredSpan(const at::Tensor& t) {
  const int64_t element = static_cast<int64_t>(t.element_size());
  const int64_t first = t.storage_offset();
  if (t.numel() == 0) return {first * element, first * element};
  int64_t lo = first;
  int64_t hi = first;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d);
    if (reach < 0) {
      lo += reach;
    } else {
      hi += reach;
    }
  }
  return {lo * element, (hi + 1) * element};
}

OffloadCore::OffloadCore(const OffloadOptions& options, c10::Device compute,
                         std::unique_ptr<SpillFile> spill)
    : options_(options),
      compute_(compute),
      prefetch_depth_(options.prefetch_depth != kPrefetchAuto ? options.prefetch_depth
                      : compute.is_cuda()                     ? kCudaPrefetchDepth
                                                              : 0),
      spill_(std::move(spill)) {
  if (spill_ != nullptr) {
    writer_running_ = true;
    writer_ = std::thread(&OffloadCore::WriterLoop, this);
  }
}

OffloadCore::~OffloadCore() { Shutdown(); }

void OffloadCore::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // from here on, reader_ is never started
  }
  // The writer finishes its queue; the reader drops what is queued (the
  // unpacks that need those records load them themselves).
  for (std::thread* worker : {&writer_, &reader_}) {
    if (!worker->joinable()) continue;
    if (worker->get_id() == std::this_thread::get_id()) {
      // The worker dropped the last reference; it exits on its own.
      worker->detach();
    } else {
      worker->join();
    }
  }
}

std::optional<SkipReason> OffloadCore::Classify(const at::Tensor& t, bool exempt) {
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return SkipReason::kWrappedNumber;
  // Never trust data_ptr() != nullptr: the layout and flags decide whether a
  // plain strided storage can be copied and restored with set_().
  if (t.is_nested() || t.layout() != c10::kStrided || !t.has_storage() ||
      t.is_quantized() || t.is_meta() || t.is_conj() || t.is_neg()) {
    return SkipReason::kNoStorage;
  }
  if (params_.contains(t.storage().unsafeGetStorageImpl()) ||
      (t.is_leaf() && t.requires_grad())) {
    return SkipReason::kParameter;
  }
  if (exempt) return SkipReason::kExempt;
  if (!options_.enabled) return SkipReason::kDisabled;
  const c10::Device device = t.device();
  if (options_.target == Target::kHost && device.is_cpu()) return SkipReason::kOnTarget;
  if (device != compute_ && !device.is_cpu()) return SkipReason::kOtherDevice;
  return std::nullopt;
}

void OffloadCore::AccountAnchor(const at::Tensor& t) {
  // TRL's pack hook: logical size against the threshold, key (pointer of the
  // first element, dtype), the whole storage for a broadcast, a compact clone
  // for any other view.
  const int64_t element = static_cast<int64_t>(t.element_size());
  const int64_t logical = t.numel() * element;
  if (logical < options_.min_offload_bytes) return;
  const auto base = reinterpret_cast<uintptr_t>(t.storage().data());
  const std::pair<uintptr_t, int> key(base + t.storage_offset() * element,
                                      static_cast<int>(t.scalar_type()));
  // The anchor's dedup at its best: a key hit counts only while it is the
  // same live storage (its address-reuse false hits, trl#6241, are not
  // credited to it).
  const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  auto [it, inserted] = anchor_keys_.try_emplace(key, t.storage().getWeakStorageImpl());
  if (!inserted) {
    if (it->second._unsafe_get_target() == impl && it->second.use_count() > 0) return;
    it->second = t.storage().getWeakStorageImpl();
  }
  bool broadcast = false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    broadcast |= t.stride(d) == 0 && t.size(d) > 1;
  }
  step_.trl_baseline_bytes_out +=
      broadcast ? static_cast<int64_t>(t.storage().nbytes()) : logical;
}

void OffloadCore::AddResident(int64_t bytes) {
  resident_ += bytes;
  step_.peak_resident_saved_bytes = std::max(step_.peak_resident_saved_bytes, resident_);
}

void OffloadCore::Keep(const at::Tensor& t, bool account, PackedTensor* packed) {
  // tensor_data(): same storage and version counter, no autograd metadata, so
  // no Node -> hooks -> tensor -> Node cycle (pytorch#115255).
  packed->kept = t.tensor_data();
  if (!account) return;
  const c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
  auto it = kept_.find(key);
  if (it != kept_.end()) {
    if (auto record = it->second.weak.lock()) {
      packed->record = std::move(record);
      return;
    }
  }
  auto record = std::make_shared<StorageRecord>(
      shared_from_this(), t.storage(), t.device(), packed->saved_version, /*kept=*/true);
  AddResident(record->storage_nbytes_);
  kept_[key] = Entry{record.get(), record};
  packed->record = std::move(record);
}

void OffloadCore::Pack(const at::Tensor& t, bool exempt, PackedTensor* packed) {
  const c10::VariableVersion& version = t.unsafeGetTensorImpl()->version_counter();
  if (version.enabled()) {
    packed->version = version;
    packed->saved_version = version.current_version();
  }
  Graveyard graveyard;  // destroyed after the lock is released
  std::shared_ptr<StorageRecord> record;
  absl::MutexLock lock(&mu_);
  ++step_.tensors_seen;
  DrainStash(/*all=*/false, &graveyard);
  const std::optional<SkipReason> skip = Classify(t, exempt);
  if (!skip || *skip == SkipReason::kDisabled || *skip == SkipReason::kOnTarget) {
    AccountAnchor(t);
  }
  if (skip) {
    ++step_.skipped_of(*skip);
    Keep(t,
         *skip == SkipReason::kDisabled || *skip == SkipReason::kOnTarget ||
             *skip == SkipReason::kExempt,
         packed);
    return;
  }
  const c10::Storage storage = t.storage();
  const ByteSpan span = CoveredSpan(t);
  if (span.size() == 0) {  // nothing to move (numel() == 0)
    ++step_.skipped_of(SkipReason::kSmall);
    Keep(t, /*account=*/false, packed);
    return;
  }
  auto it = offloaded_.find(storage.unsafeGetStorageImpl());
  if (it != offloaded_.end()) record = it->second.weak.lock();
  // A storage changed in place since its record was made holds other bytes
  // now: start a new record rather than mixing versions.
  if (record != nullptr && record->version_ != packed->saved_version) {
    graveyard.push_back(std::move(record));
    record = nullptr;
  }
  if (record != nullptr) {
    const int64_t moved = Cover(record, storage, span, &graveyard);
    ++step_.dedup_hits;
    step_.dedup_bytes_saved += span.size() - moved;
  } else {
    if (span.size() < options_.min_offload_bytes) {
      ++step_.skipped_of(SkipReason::kSmall);
      Keep(t, /*account=*/true, packed);
      return;
    }
    record = std::make_shared<StorageRecord>(shared_from_this(), storage, t.device(),
                                             packed->saved_version, /*kept=*/false);
    offloaded_[storage.unsafeGetStorageImpl()] = Entry{record.get(), record};
    record->step_id_ = step_id_;
    record->sequence_ = static_cast<int64_t>(forward_order_.size());
    forward_order_.push_back(record);
    Cover(record, storage, span, &graveyard);
  }
  ++step_.tensors_offloaded;
  packed->dtype = t.scalar_type();
  packed->sizes = t.sizes().vec();
  packed->strides = t.strides().vec();
  packed->byte_offset = t.storage_offset() * static_cast<int64_t>(t.element_size());
  packed->record = std::move(record);
}

// A later view that reaches past what the record holds is handled by moving
// only the missing bytes now, while the view (and so the storage) is alive:
// waiting for "all views" would keep the whole storage on the device until
// the end of forward. Bytes moved per storage = the union of the saved spans.
int64_t OffloadCore::Cover(const std::shared_ptr<StorageRecord>& record,
                           const c10::Storage& storage, ByteSpan span,
                           Graveyard* graveyard) {
  std::vector<ByteSpan> held;
  held.reserve(record->segments_.size());
  for (const Segment& s : record->segments_) held.push_back(s.span);
  std::sort(held.begin(), held.end(),
            [](const ByteSpan& a, const ByteSpan& b) { return a.begin < b.begin; });
  std::vector<ByteSpan> gaps;
  int64_t cursor = span.begin;
  for (const ByteSpan& h : held) {
    if (h.end <= cursor) continue;
    if (h.begin >= span.end) break;
    if (h.begin > cursor) gaps.push_back({cursor, h.begin});
    cursor = std::max(cursor, h.end);
  }
  if (cursor < span.end) gaps.push_back({cursor, span.end});
  if (!gaps.empty()) {
    // A cached reload (a storage alive across a backward, e.g. with
    // retain_graph) lacks the new bytes: the next unpack rebuilds it.
    ++record->generation_;
    if (record->reloaded_.defined()) {
      AddResident(-record->reloaded_.numel());
      record->reloaded_.reset();
      record->reload_done_ = nullptr;
      record->prefetch_queued_ = false;
    }
  }
  int64_t moved = 0;
  for (const ByteSpan& gap : gaps) {
    Segment segment;
    segment.span = gap;
    record->segments_.push_back(std::move(segment));
    try {
      StartCopy(record, record->segments_.size() - 1, storage, graveyard);
    } catch (...) {
      record->segments_.pop_back();  // never started: nothing to wait for
      throw;
    }
    moved += gap.size();
  }
  step_.bytes_out += moved;
  return moved;
}

void OffloadCore::StartCopy(const std::shared_ptr<StorageRecord>& record, size_t index,
                            const c10::Storage& storage, Graveyard* graveyard) {
  // Everything that can throw (allocations, CUDA calls) runs before the
  // record counts the copy as pending, so a failed pack leaves it consistent.
  const ByteSpan span = record->segments_[index].span;
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
    stash_.push_back(StashEntry{record, index});
    DrainStash(/*all=*/false, graveyard);
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
    FinishCopy(record.get(), index, status.ok() ? "" : status.ToString());
    return;
  }
  // Bounded queue: the sources of queued blocks stay resident.
  mu_.Await(absl::Condition(this, &OffloadCore::WriterHasRoom));
  ++in_flight_;
  queue_.push_back(std::move(job));
}

void OffloadCore::DrainStash(bool all, Graveyard* graveyard) {
  while (!stash_.empty()) {
    StashEntry& front = stash_.front();
    Segment& segment = front.record->segments_[front.segment];
    const bool over = static_cast<int>(stash_.size()) > options_.max_copies_in_flight;
    if (!CopyFinished(segment.cuda_done)) {
      if (!all && !over) break;
      WaitCopy(segment.cuda_done);
    }
    segment.cuda_done = nullptr;
    FinishCopy(front.record.get(), front.segment, "");
    graveyard->push_back(std::move(front.record));
    stash_.pop_front();
  }
}

void OffloadCore::FinishCopy(StorageRecord* record, size_t index,
                             const std::string& error) {
  Segment& segment = record->segments_[index];
  segment.error = error;
  if (--record->pending_ == 0) AddResident(-record->storage_nbytes_);
}

void OffloadCore::WriterLoop() {
  while (true) {
    WriteJob job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &OffloadCore::WriterHasWork));
      if (queue_.empty()) {
        writer_running_ = false;
        return;
      }
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    WaitCopy(job.done);
    const absl::Status status = spill_->Write(
        job.file_offset, job.staging.defined() ? job.staging.data_ptr() : job.data,
        job.bytes);
    // Release the source before the copy counts as finished: Flush() returning
    // means the device bytes are free.
    job.source = c10::Storage();
    job.staging.reset();
    {
      absl::MutexLock lock(&mu_);
      FinishCopy(job.record.get(), job.segment, status.ok() ? "" : status.ToString());
    }
    // Maybe the last reference to the record (its destructor takes mu_): it
    // goes before the job counts as done, so that once Flush() returns the
    // writer keeps no released graph's record alive.
    job.record.reset();
    absl::MutexLock lock(&mu_);
    --in_flight_;
  }
}

void OffloadCore::SchedulePrefetch(const StorageRecord& current, Graveyard* graveyard) {
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
      prefetch_queue_.push_back(record);
      queued = true;
    }
    graveyard->push_back(std::move(record));
  }
  if (queued && !reader_.joinable())
    reader_ = std::thread(&OffloadCore::ReaderLoop, this);
}

void OffloadCore::ReaderLoop() {
  while (true) {
    std::shared_ptr<StorageRecord> record;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &OffloadCore::ReaderHasWork));
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

void OffloadCore::QuiesceReader() {
  prefetch_queue_.clear();
  mu_.Await(absl::Condition(this, &OffloadCore::ReaderIdle));
}

void OffloadCore::Flush() {
  Graveyard graveyard;
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &OffloadCore::WriterIdle));
  DrainStash(/*all=*/true, &graveyard);
  QuiesceReader();
}

void OffloadCore::ForgetRecord(StorageRecord* record) {
  absl::MutexLock lock(&mu_);
  auto& map = record->kept_ ? kept_ : offloaded_;
  auto it = map.find(record->key_);
  if (it != map.end() && it->second.raw == record) map.erase(it);
  if (record->kept_) AddResident(-record->storage_nbytes_);
  for (const Segment& segment : record->segments_) {
    if (segment.host.defined()) host_held_ -= segment.span.size();
    if (segment.file_offset >= 0) spill_->Free(segment.file_offset, segment.span.size());
  }
  if (record->reloaded_.defined()) AddResident(-record->reloaded_.numel());
}

void OffloadCore::BeginStep(const std::vector<at::Tensor>& params_and_buffers) {
  absl::MutexLock lock(&mu_);
  params_.clear();
  param_refs_.clear();
  for (const at::Tensor& t : params_and_buffers) {
    if (!t.defined() || !t.has_storage()) continue;
    // Holding a weak reference pins the StorageImpl's address: a freed
    // parameter's address cannot come back as an activation's storage.
    if (params_.insert(t.storage().unsafeGetStorageImpl()).second) {
      param_refs_.push_back(t.storage().getWeakStorageImpl());
    }
  }
  offloaded_.clear();
  kept_.clear();
  anchor_keys_.clear();
  ++step_id_;
  forward_order_.clear();
}

OffloadStats OffloadCore::WithGauges(OffloadStats stats) const {
  stats.resident_saved_bytes = resident_;
  stats.host_bytes_held = host_held_;
  stats.disk_bytes_held = spill_ == nullptr ? 0 : spill_->bytes_held();
  return stats;
}

OffloadStats OffloadCore::EndStep() {
  absl::MutexLock lock(&mu_);
  QuiesceReader();
  const OffloadStats step = WithGauges(step_);
  totals_.Add(step);
  step_ = OffloadStats();
  step_.peak_resident_saved_bytes = resident_;
  return step;
}

OffloadStats OffloadCore::Totals() const {
  absl::MutexLock lock(&mu_);
  OffloadStats totals = totals_;
  totals.Add(WithGauges(step_));
  return totals;
}

OffloadStats OffloadCore::Current() const {
  absl::MutexLock lock(&mu_);
  return WithGauges(step_);
}

bool OffloadCore::IsParameterStorage(const at::Tensor& t) const {
  if (!t.defined() || !t.has_storage()) return false;
  absl::MutexLock lock(&mu_);
  return params_.contains(t.storage().unsafeGetStorageImpl());
}

int64_t OffloadCore::parameter_storage_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(params_.size());
}

int64_t OffloadCore::spill_file_bytes() const {
  return spill_ == nullptr ? 0 : spill_->file_bytes();
}

}  // namespace memprofd::offload::internal
