#ifndef MEMPROFD_CORE_OFFLOAD_INTERNAL_SAVED_TENSOR_STORE_H_
#define MEMPROFD_CORE_OFFLOAD_INTERNAL_SAVED_TENSOR_STORE_H_

// The store behind an Offloader: where the tensors autograd saves go between
// pack and unpack, and the state it shares with the hooks of every tensor it
// packed. Private to core/offload. Its definitions are split by purpose:
//   saved_tensor_store.cc  lifetime, Unpack, steps, statistics
//   pack_policy.cc         what Pack keeps or offloads, dedup of spans
//   copy_out.cc            copies off the device and the spill-file writer
//   prefetch.cc            the backward read-ahead
// and the TRL-baseline accounting is its own class (trl_baseline.h).
//
// It stays one class of many members, on purpose: pack (forward thread),
// unpack (autograd's threads), the spill-file writer and the read-ahead
// reader all read and change the same storage records, copies in flight and
// statistics, and one mutex over all of them is what keeps their invariants
// (a storage moved at most once a step, every byte given back) simple to
// check. Its code is split by purpose across files instead.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "core/offload/internal/device_copy.h"
#include "core/offload/internal/spill_file.h"
#include "core/offload/internal/storage_record.h"
#include "core/offload/internal/trl_baseline.h"
#include "core/offload/offload_options.h"

namespace memprofd::offload::internal {

// What one saved tensor keeps between pack and unpack.
struct PackedTensor {
  at::Tensor kept;                        // not offloaded: its tensor_data()
  std::shared_ptr<StorageRecord> record;  // offloaded, or kept-bytes accounting
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t byte_offset = 0;
  c10::VariableVersion version{c10::VariableVersion::DISABLED};
  uint32_t saved_version = 0;
};

// The state an Offloader shares with the hooks of every tensor it packed:
// the step's storage records, the copies in flight, the spill file and its
// writer thread, the read-ahead's reader thread and the statistics.
// Thread-safe (one mutex); pack runs on the forward thread, unpack on autograd
// threads, the writer and the reader on their own threads.
class SavedTensorStore : public std::enable_shared_from_this<SavedTensorStore> {
 public:
  // `meta_copies_in_flight`: a dry run's copies out stay in flight by the
  // real offloader's limit (Offloader's MetaCopies::kInFlight).
  SavedTensorStore(const OffloadOptions& options, c10::Device compute,
                   std::unique_ptr<SpillFile> spill, bool meta_copies_in_flight = false);
  ~SavedTensorStore();

  const OffloadOptions& options() const { return options_; }
  c10::Device compute() const { return compute_; }

  // Keeps `t` or starts copying the span it covers off the device, and fills
  // `packed`; `exempt`: saved inside a NoOffloadScope. Forward thread.
  void Pack(const at::Tensor& t, bool exempt, PackedTensor* packed);
  // The tensor `packed` stands for, brought back if it was offloaded. Throws
  // c10::Error when it was changed in place since it was saved or cannot be
  // read back. Any thread.
  at::Tensor Unpack(const PackedTensor& packed);

  void BeginStep(const std::vector<at::Tensor>& params_and_buffers);
  // Decides the effectiveness of every record of this step not decided yet
  // (Offloader::MarkForwardEnd). Forward thread.
  void MarkForwardEnd();
  OffloadStats EndStep();
  OffloadStats Totals() const;
  OffloadStats Current() const;
  bool IsParameterStorage(const at::Tensor& t) const;
  int64_t parameter_storage_count() const;
  int64_t spill_file_bytes() const;

  // Waits for every copy out and for the read-ahead to stop.
  void Flush();
  // Stops and joins the writer (after its queue) and the reader (idempotent).
  void Shutdown();

 private:
  friend class StorageRecord;
  // References to records dropped while mu_ is held: they are released here
  // after mu_ is, since the last one's destructor takes mu_.
  using RecordsToReleaseUnlocked = std::vector<std::shared_ptr<StorageRecord>>;
  struct Entry {
    StorageRecord* raw = nullptr;
    std::weak_ptr<StorageRecord> weak;
  };

  // --- Pack policy (pack_policy.cc) ---
  // Why `t` stays where it is; nullopt when it is to be offloaded.
  std::optional<SkipReason> Classify(const at::Tensor& t, bool exempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps `t` where it is. KeepAndCountResident also counts its storage in
  // resident_saved_bytes (once per storage while kept views of it are saved):
  // for saved activations that stay (offloading off, exempt, on target,
  // small). KeepUncounted leaves the accounting alone: parameters, tensors
  // without a plain storage or on another device, empty ones.
  void KeepAndCountResident(const at::Tensor& t, PackedTensor* packed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void KeepUncounted(const at::Tensor& t, PackedTensor* packed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts copying the parts of `span` that `record` does not hold yet;
  // returns the bytes that will move.
  int64_t CopyUncoveredBytes(const std::shared_ptr<StorageRecord>& record,
                             const c10::Storage& storage, ByteSpan span,
                             RecordsToReleaseUnlocked* to_release)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- Copies out and the spill-file writer (copy_out.cc) ---
  struct WriteJob {
    std::shared_ptr<StorageRecord> record;
    size_t segment = 0;
    c10::Storage source;         // CPU source, alive until written
    const void* data = nullptr;  // bytes to write
    at::Tensor staging;          // pinned copy of a CUDA source
    CopyDone done;               // completion of the copy to `staging`
    int64_t bytes = 0;
    int64_t file_offset = 0;
  };
  struct CopyToHost {
    std::shared_ptr<StorageRecord> record;
    size_t segment;
  };
  // Which copies to host RetireCopiesToHost waits for: only the oldest
  // while more than max_copies_in_flight are in flight, or all of them. (A
  // dry run's copies held in flight wait there too, and count as finished
  // only when waited for.)
  enum class CopyWait { kOverLimit, kAll };
  // Starts the copy of segment `index` of `record` (a span of `storage`): to
  // pinned host memory, or to the spill file through the writer.
  void StartCopy(const std::shared_ptr<StorageRecord>& record, size_t index,
                 const c10::Storage& storage, RecordsToReleaseUnlocked* to_release)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Retires the finished CUDA copies to host, waiting for those `wait` names.
  void RetireCopiesToHost(CopyWait wait, RecordsToReleaseUnlocked* to_release)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishCopy(StorageRecord* record, size_t index, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriterLoop();
  bool WriterHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !write_queue_.empty() || stopping_;
  }
  bool WriterHasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return writes_in_flight_ < options_.max_copies_in_flight;
  }
  bool WriterIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return writes_in_flight_ == 0;
  }

  // --- Backward read-ahead (prefetch.cc) ---
  // Queues the read-ahead of the prefetch_depth live records offloaded just
  // before `current` in forward (the ones backward needs next); starts the
  // reader thread the first time. A dry run (meta) has no reader thread: the
  // records are added to `load_now` instead, for the caller to load at once
  // on its own thread (its allocations then stay in the dry run's
  // accounting), as a reader that keeps up would.
  void SchedulePrefetch(const StorageRecord& current,
                        RecordsToReleaseUnlocked* to_release,
                        std::vector<std::shared_ptr<StorageRecord>>* load_now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the queued read-ahead and waits for the load under way: once
  // backward is over, what is left of it is of no use, and the reader must
  // not keep a released graph's record alive past this point.
  void QuiesceReader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReaderLoop();
  bool ReaderHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !prefetch_queue_.empty() || stopping_;
  }
  bool ReaderIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !reader_busy_; }

  // --- Accounting and records (saved_tensor_store.cc) ---
  void AddResident(int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts `record`'s copied bytes as effective when its storage has no
  // reference left but the store's own (source_refs_): the device memory went
  // free; else as ineffective. Once per record; no-op for kept records.
  void DecideEffectiveness(StorageRecord* record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetRecord(StorageRecord* record) ABSL_LOCKS_EXCLUDED(mu_);
  OffloadStats WithGauges(OffloadStats stats) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const OffloadOptions options_;
  const c10::Device compute_;
  const int prefetch_depth_;  // options_.prefetch_depth, auto resolved
  const bool meta_copies_in_flight_;
  const std::unique_ptr<SpillFile> spill_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<const c10::StorageImpl*, Entry> offloaded_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const c10::StorageImpl*, Entry> kept_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<const c10::StorageImpl*> params_ ABSL_GUARDED_BY(mu_);
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> param_refs_ ABSL_GUARDED_BY(mu_);
  TrlBaseline trl_baseline_ ABSL_GUARDED_BY(mu_);

  OffloadStats step_ ABSL_GUARDED_BY(mu_);
  OffloadStats totals_ ABSL_GUARDED_BY(mu_);
  int64_t resident_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t host_held_ ABSL_GUARDED_BY(mu_) = 0;

  std::deque<WriteJob> write_queue_ ABSL_GUARDED_BY(mu_);
  int writes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;               // queued or being written
  std::deque<CopyToHost> copies_to_host_ ABSL_GUARDED_BY(mu_);  // CUDA, in flight
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool writer_running_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;

  // Backward read-ahead: this step's offloaded records in forward order, and
  // the ones queued for the reader thread (weak: a released graph frees its
  // records even while they wait here).
  int64_t step_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::weak_ptr<StorageRecord>> forward_order_ ABSL_GUARDED_BY(mu_);
  std::deque<std::weak_ptr<StorageRecord>> prefetch_queue_ ABSL_GUARDED_BY(mu_);
  bool reader_busy_ ABSL_GUARDED_BY(mu_) = false;  // holds a record
  std::thread reader_;  // started by the first SchedulePrefetch, under mu_
};

}  // namespace memprofd::offload::internal

#endif  // MEMPROFD_CORE_OFFLOAD_INTERNAL_SAVED_TENSOR_STORE_H_
