// SavedTensorStore's pack policy: which saved tensors stay where they are
// (and whether they count as resident), which are offloaded, and which bytes
// of an offloaded storage still have to move (dedup of the spans its views
// cover).

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "core/offload/internal/saved_tensor_store.h"

namespace memprofd::offload::internal {
namespace {

// The bytes of its storage that strided tensor `t` can read: from its first
// to its last element (a broadcast or strided view covers less than its
// logical size, a slice less than its storage). Empty for numel() == 0.
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

// Whether a tensor kept for `reason` is a saved activation whose storage
// counts as resident: it would have moved but for the options or the scope.
bool CountsAsResident(SkipReason reason) {
  return reason == SkipReason::kDisabled || reason == SkipReason::kOnTarget ||
         reason == SkipReason::kExempt;
}

// Whether the TRL baseline sees `t`: TRL's hook would have offloaded it.
bool TrlBaselineSees(const std::optional<SkipReason>& skip) {
  return !skip || *skip == SkipReason::kDisabled || *skip == SkipReason::kOnTarget;
}

}  // namespace

std::optional<SkipReason> SavedTensorStore::Classify(const at::Tensor& t, bool exempt) {
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return SkipReason::kWrappedNumber;
  // Never trust data_ptr() != nullptr: the layout and flags decide whether a
  // plain strided storage can be copied and restored with set_().
  // A meta tensor has a storage to account but no data: only a dry run's
  // store (compute device meta) handles it.
  if (t.is_nested() || t.layout() != c10::kStrided || !t.has_storage() ||
      t.is_quantized() || (t.is_meta() && !compute_.is_meta()) || t.is_conj() ||
      t.is_neg()) {
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

void SavedTensorStore::KeepUncounted(const at::Tensor& t, PackedTensor* packed) {
  // tensor_data(): same storage and version counter, no autograd metadata, so
  // no Node -> hooks -> tensor -> Node cycle (pytorch#115255).
  packed->kept = t.tensor_data();
}

void SavedTensorStore::KeepAndCountResident(const at::Tensor& t, PackedTensor* packed) {
  KeepUncounted(t, packed);
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

void SavedTensorStore::Pack(const at::Tensor& t, bool exempt, PackedTensor* packed) {
  const c10::VariableVersion& version = t.unsafeGetTensorImpl()->version_counter();
  if (version.enabled()) {
    packed->version = version;
    packed->saved_version = version.current_version();
  }
  RecordsToReleaseUnlocked to_release;  // destroyed after the lock is released
  std::shared_ptr<StorageRecord> record;
  absl::MutexLock lock(&mu_);
  ++step_.tensors_seen;
  RetireCopiesToHost(CopyWait::kOverLimit, &to_release);
  const std::optional<SkipReason> skip = Classify(t, exempt);
  if (TrlBaselineSees(skip)) {
    step_.trl_baseline_bytes_out += trl_baseline_.BytesOut(t, options_.min_offload_bytes);
  }
  if (skip) {
    ++step_.skipped_of(*skip);
    if (CountsAsResident(*skip)) {
      KeepAndCountResident(t, packed);
    } else {
      KeepUncounted(t, packed);
    }
    return;
  }
  const c10::Storage storage = t.storage();
  const ByteSpan span = CoveredSpan(t);
  if (span.size() == 0) {  // nothing to move (numel() == 0)
    ++step_.skipped_of(SkipReason::kSmall);
    KeepUncounted(t, packed);
    return;
  }
  auto it = offloaded_.find(storage.unsafeGetStorageImpl());
  if (it != offloaded_.end()) record = it->second.weak.lock();
  // A storage changed in place since its record was made holds other bytes
  // now: start a new record rather than mixing versions.
  if (record != nullptr && record->version_ != packed->saved_version) {
    to_release.push_back(std::move(record));
    record = nullptr;
  }
  if (record != nullptr) {
    const int64_t moved = CopyUncoveredBytes(record, storage, span, &to_release);
    ++step_.dedup_hits;
    step_.dedup_bytes_saved += span.size() - moved;
  } else {
    if (span.size() < options_.min_offload_bytes) {
      ++step_.skipped_of(SkipReason::kSmall);
      KeepAndCountResident(t, packed);
      return;
    }
    record = std::make_shared<StorageRecord>(shared_from_this(), storage, t.device(),
                                             packed->saved_version, /*kept=*/false);
    offloaded_[storage.unsafeGetStorageImpl()] = Entry{record.get(), record};
    record->step_id_ = step_id_;
    record->sequence_ = static_cast<int64_t>(forward_order_.size());
    forward_order_.push_back(record);
    CopyUncoveredBytes(record, storage, span, &to_release);
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
int64_t SavedTensorStore::CopyUncoveredBytes(const std::shared_ptr<StorageRecord>& record,
                                             const c10::Storage& storage, ByteSpan span,
                                             RecordsToReleaseUnlocked* to_release) {
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
      StartCopy(record, record->segments_.size() - 1, storage, to_release);
    } catch (...) {
      record->segments_.pop_back();  // never started: nothing to wait for
      throw;
    }
    moved += gap.size();
  }
  step_.bytes_out += moved;
  // Bytes added to a record already decided follow its verdict.
  if (record->decided_) {
    (record->effective_ ? step_.effective_bytes : step_.ineffective_bytes) += moved;
  }
  return moved;
}

}  // namespace memprofd::offload::internal
