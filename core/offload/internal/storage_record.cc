// StorageRecord: bringing an offloaded storage's segments back (Load) and
// handing the reloaded buffer to an unpack (Reload).

#include "core/offload/internal/storage_record.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "core/common/attribution.h"
#include "core/offload/internal/saved_tensor_store.h"

namespace memprofd::offload::internal {
namespace {

// The reloaded buffer stands for storage bytes [0, end of the last span), so
// every view comes back with its exact storage offset and its original
// alignment (vectorized kernels take the same paths: bit-identical results).
// Only the covered spans are copied; the prefix is never touched (on CPU,
// large untouched allocations are not even committed). It is never larger
// than the original storage.
constexpr int64_t kReloadStart = 0;

}  // namespace

StorageRecord::StorageRecord(std::shared_ptr<SavedTensorStore> store,
                             const c10::Storage& storage, c10::Device device,
                             uint32_t version, bool kept)
    : store_(std::move(store)),
      key_(storage.unsafeGetStorageImpl()),
      storage_(storage.getWeakStorageImpl()),
      storage_nbytes_(static_cast<int64_t>(storage.nbytes())),
      device_(device),
      version_(version),
      kept_(kept) {}

StorageRecord::~StorageRecord() { store_->ForgetRecord(this); }

StorageRecord::Loaded StorageRecord::Load(bool prefetch) {
  absl::MutexLock reload_lock(&reload_mu_);
  std::vector<Segment> segments;
  int64_t generation = 0;
  {
    SavedTensorStore::RecordsToReleaseUnlocked to_release;
    absl::MutexLock lock(&store_->mu_);
    store_->RetireCopiesToHost(SavedTensorStore::CopyWait::kAll, &to_release);
    store_->mu_.Await(absl::Condition(
        +[](StorageRecord* r) { return r->pending_ == 0; }, this));
    // First reload without a decision (a checkpoint recompute's records, or
    // no MarkForwardEnd): whatever forward kept is gone by now.
    store_->DecideEffectiveness(this);
    if (reloaded_.defined()) return Loaded{reloaded_, reload_base_, reload_done_};
    segments = segments_;
    generation = generation_;
  }
  int64_t hi = 0;
  for (const Segment& s : segments) {
    TORCH_CHECK(s.error.empty(), "cannot bring back an offloaded activation: ", s.error);
    hi = std::max(hi, s.span.end);
  }
  TORCH_CHECK(!segments.empty(), "offloaded activation has no data (internal error)");
  const int64_t start = kReloadStart;
  // A saved activation brought back for backward.
  CategoryScope category(Category::kSavedActivations);
  at::Tensor out =
      at::empty({hi - start}, at::TensorOptions().dtype(at::kByte).device(device_));
  // Spill-file extents are read straight into a CPU buffer; a CUDA buffer is
  // filled from pinned memory (the host copy, or a pinned staging block the
  // extent is read into) by copies that do not block this thread.
  std::vector<HostToDevice> copies;
  int64_t moved = 0;
  for (const Segment& s : segments) {
    at::Tensor dst = out.narrow(0, s.span.begin - start, s.span.size());
    if (device_.is_meta()) {
      // A dry run: nothing to read (meta tensors have no data).
    } else if (s.host.defined()) {
      copies.push_back({s.host, dst});
    } else {
      at::Tensor into = device_.is_cpu() ? dst : EmptyPinned(s.span.size());
      const absl::Status status =
          store_->spill_->Read(s.file_offset, into.data_ptr(), s.span.size());
      TORCH_CHECK(status.ok(),
                  "cannot bring back an offloaded activation: ", status.ToString());
      if (!device_.is_cpu()) copies.push_back({std::move(into), dst});
    }
    moved += s.span.size();
  }
  CopyDone done = StartCopiesToDevice(copies);
  absl::MutexLock lock(&store_->mu_);
  store_->step_.bytes_in += moved;
  if (prefetch) store_->step_.bytes_prefetched += moved;
  if (generation == generation_) {  // else segments were added meanwhile: do not cache
    reloaded_ = out;
    reload_base_ = start;
    reload_done_ = done;
    store_->AddResident(out.numel());
  }
  return Loaded{std::move(out), start, std::move(done)};
}

void StorageRecord::Reload(at::Tensor* buffer, int64_t* base) {
  const auto started = std::chrono::steady_clock::now();
  {
    std::vector<std::shared_ptr<StorageRecord>> load_now;  // a dry run's read-ahead
    {
      SavedTensorStore::RecordsToReleaseUnlocked to_release;
      absl::MutexLock lock(&store_->mu_);
      store_->SchedulePrefetch(*this, &to_release, &load_now);
    }
    for (const std::shared_ptr<StorageRecord>& record : load_now) {
      record->Load(/*prefetch=*/true);
    }
  }
  Loaded loaded = Load(/*prefetch=*/false);
  UseOnCurrentStream(loaded.done, loaded.buffer);
  const int64_t waited = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - started)
                             .count();
  {
    absl::MutexLock lock(&store_->mu_);
    store_->step_.reload_wait_ns += waited;
  }
  *buffer = std::move(loaded.buffer);
  *base = loaded.base;
}

}  // namespace memprofd::offload::internal
