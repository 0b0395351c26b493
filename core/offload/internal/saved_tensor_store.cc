// SavedTensorStore: its lifetime (threads started and joined), Unpack, the
// step boundaries, and the accounting of records and resident bytes behind
// the statistics.

#include "core/offload/internal/saved_tensor_store.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace memprofd::offload::internal {

SavedTensorStore::SavedTensorStore(const OffloadOptions& options, c10::Device compute,
                                   std::unique_ptr<SpillFile> spill,
                                   bool meta_copies_in_flight)
    : options_(options),
      compute_(compute),
      prefetch_depth_(options.prefetch_depth != kPrefetchAuto ? options.prefetch_depth
                      : compute.is_cuda()                     ? kCudaPrefetchDepth
                                                              : 0),
      meta_copies_in_flight_(meta_copies_in_flight),
      spill_(std::move(spill)) {
  if (spill_ != nullptr) {
    writer_running_ = true;
    writer_ = std::thread(&SavedTensorStore::WriterLoop, this);
  }
}

SavedTensorStore::~SavedTensorStore() { Shutdown(); }

void SavedTensorStore::Shutdown() {
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

at::Tensor SavedTensorStore::Unpack(const PackedTensor& packed) {
  // Autograd skips its version check when hooks are set (saved_variable.cpp),
  // so the check is ours; same wording, so callers see the usual error.
  if (packed.version.enabled()) {
    const uint32_t current = packed.version.current_version();
    TORCH_CHECK(
        current == packed.saved_version,
        "one of the variables needed for gradient computation has been modified "
        "by an inplace operation: [",
        packed.kept.defined() ? packed.kept.toString() : c10::toString(packed.dtype), " ",
        packed.kept.defined() ? packed.kept.sizes() : c10::IntArrayRef(packed.sizes),
        "] is at version ", current, "; expected version ", packed.saved_version,
        " instead. (Checked by memprofd's activation offloader; the tensor was "
        "changed in place after autograd saved it.)");
  }
  if (packed.kept.defined()) return packed.kept;
  at::Tensor buffer;
  int64_t base = 0;
  packed.record->Reload(&buffer, &base);
  const auto element = static_cast<int64_t>(c10::elementSize(packed.dtype));
  at::Tensor out = at::empty({0}, buffer.options().dtype(packed.dtype));
  out.set_(buffer.storage(), (packed.byte_offset - base) / element, packed.sizes,
           packed.strides);
  return out;
}

void SavedTensorStore::Flush() {
  RecordsToReleaseUnlocked to_release;
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &SavedTensorStore::WriterIdle));
  RetireCopiesToHost(CopyWait::kAll, &to_release);
  QuiesceReader();
}

void SavedTensorStore::AddResident(int64_t bytes) {
  resident_ += bytes;
  step_.peak_resident_saved_bytes = std::max(step_.peak_resident_saved_bytes, resident_);
}

void SavedTensorStore::DecideEffectiveness(StorageRecord* record) {
  if (record->kept_ || record->decided_) return;
  // Strong references: saved tensors hold none (an offloaded PackedTensor
  // keeps only the record), so what is left besides the store's queued
  // sources is another holder. Each of those drops under mu_, so the two
  // counts agree here.
  const int64_t others =
      static_cast<int64_t>(record->storage_.use_count()) - record->source_refs_;
  int64_t copied = 0;
  for (const Segment& segment : record->segments_) copied += segment.span.size();
  record->decided_ = true;
  record->effective_ = others <= 0;
  (record->effective_ ? step_.effective_bytes : step_.ineffective_bytes) += copied;
}

void SavedTensorStore::MarkForwardEnd() {
  RecordsToReleaseUnlocked to_release;  // destroyed after the lock is released
  absl::MutexLock lock(&mu_);
  for (const std::weak_ptr<StorageRecord>& weak : forward_order_) {
    std::shared_ptr<StorageRecord> record = weak.lock();
    if (record == nullptr) continue;
    DecideEffectiveness(record.get());
    to_release.push_back(std::move(record));
  }
}

void SavedTensorStore::ForgetRecord(StorageRecord* record) {
  absl::MutexLock lock(&mu_);
  // Released before any decision (no MarkForwardEnd, never unpacked): decided
  // now, counted in the period it ends in.
  DecideEffectiveness(record);
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

void SavedTensorStore::BeginStep(const std::vector<at::Tensor>& params_and_buffers) {
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
  trl_baseline_.Reset();
  ++step_id_;
  forward_order_.clear();
}

OffloadStats SavedTensorStore::WithGauges(OffloadStats stats) const {
  stats.resident_saved_bytes = resident_;
  stats.host_bytes_held = host_held_;
  stats.disk_bytes_held = spill_ == nullptr ? 0 : spill_->bytes_held();
  return stats;
}

OffloadStats SavedTensorStore::EndStep() {
  RecordsToReleaseUnlocked to_release;  // destroyed after the lock is released
  absl::MutexLock lock(&mu_);
  // A dry run's copies still held in flight (of records backward never
  // reloaded) end with the step, as a real step's have by then.
  if (meta_copies_in_flight_) RetireCopiesToHost(CopyWait::kAll, &to_release);
  QuiesceReader();
  const OffloadStats step = WithGauges(step_);
  totals_.Add(step);
  step_ = OffloadStats();
  step_.peak_resident_saved_bytes = resident_;
  return step;
}

OffloadStats SavedTensorStore::Totals() const {
  absl::MutexLock lock(&mu_);
  OffloadStats totals = totals_;
  totals.Add(WithGauges(step_));
  return totals;
}

OffloadStats SavedTensorStore::Current() const {
  absl::MutexLock lock(&mu_);
  return WithGauges(step_);
}

bool SavedTensorStore::IsParameterStorage(const at::Tensor& t) const {
  if (!t.defined() || !t.has_storage()) return false;
  absl::MutexLock lock(&mu_);
  return params_.contains(t.storage().unsafeGetStorageImpl());
}

int64_t SavedTensorStore::parameter_storage_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(params_.size());
}

int64_t SavedTensorStore::spill_file_bytes() const {
  return spill_ == nullptr ? 0 : spill_->file_bytes();
}

}  // namespace memprofd::offload::internal
