#ifndef MEMPROFD_CORE_OFFLOAD_INTERNAL_OFFLOAD_CORE_H_
#define MEMPROFD_CORE_OFFLOAD_INTERNAL_OFFLOAD_CORE_H_

// The offloader's shared state and the per-storage records that saved tensors
// point to. Private to core/offload.

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
#include "core/offload/offload_options.h"

namespace memprofd::offload::internal {

class OffloadCore;

// Bytes [begin, end) of a storage.
struct ByteSpan {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The bytes of its storage that strided tensor `t` can read: from its first
// to its last element (a broadcast or strided view covers less than its
// logical size, a slice less than its storage). Empty for numel() == 0.
ByteSpan CoveredSpan(const at::Tensor& t);

// One block of an offloaded storage and where its copy lives.
struct Segment {
  ByteSpan span;
  at::Tensor host;           // host copy (kByte CPU tensor), or undefined
  int64_t file_offset = -1;  // extent in the spill file, or -1
  std::string error;         // why the copy out failed, if it did
  CopyDone cuda_done;        // CUDA copy to `host` in flight
};

// Everything saved this step from one storage. Offloaded records own the
// copies of the covered spans (one copy per byte, whatever the number of
// views); kept records only account the device bytes that kept views hold
// alive. Shared by the hooks of all those views and freed with the last one.
// Holding a weak reference to the StorageImpl keeps its address from being
// reused while the record lives, so keying records by address has no ABA.
// Fields are guarded by the owning core's mutex.
class StorageRecord {
 public:
  StorageRecord(std::shared_ptr<OffloadCore> core, const c10::Storage& storage,
                c10::Device device, uint32_t version, bool kept);
  ~StorageRecord();
  StorageRecord(const StorageRecord&) = delete;
  StorageRecord& operator=(const StorageRecord&) = delete;

  // The reloaded copy (kByte, on the storage's device), ready for use on the
  // calling thread's current stream, and the storage byte its first element
  // stands for. Repeatable; the buffer is shared by every view and cached
  // while the record lives. Starts the read-ahead of the records backward
  // needs next. Throws c10::Error on I/O errors.
  void Reload(at::Tensor* buffer, int64_t* base);

 private:
  friend class OffloadCore;

  // What Load produced: the buffer, its base, and the completion of the
  // device copies that fill it (null on CPU: filled on return).
  struct Loaded {
    at::Tensor buffer;
    int64_t base = 0;
    CopyDone done;
  };
  // Brings the segments back (once: later calls return the cached buffer).
  // Any thread; `prefetch` tells the read-ahead's calls apart in the stats.
  Loaded Load(bool prefetch);

  const std::shared_ptr<OffloadCore> core_;
  const c10::StorageImpl* const key_;
  const c10::weak_intrusive_ptr<c10::StorageImpl> storage_;
  const int64_t storage_nbytes_;
  const c10::Device device_;
  const uint32_t version_;
  const bool kept_;

  std::vector<Segment> segments_;  // offloaded records, sorted by nothing
  int pending_ = 0;                // copies out not finished
  int64_t generation_ = 0;         // bumped when segments are added
  at::Tensor reloaded_;
  int64_t reload_base_ = 0;
  CopyDone reload_done_;  // completion of the copies filling reloaded_
  // Position in the step's forward order (offloaded records only), for the
  // read-ahead; -1 for kept records.
  int64_t step_id_ = 0;
  int64_t sequence_ = -1;
  bool prefetch_queued_ = false;
  absl::Mutex reload_mu_;  // serializes loads of this record
};

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

// The state an Offloader shares with the hooks of every tensor it packed.
// Thread-safe (one mutex); pack runs on the forward thread, unpack on autograd
// threads, the writer on its own thread.
class OffloadCore : public std::enable_shared_from_this<OffloadCore> {
 public:
  OffloadCore(const OffloadOptions& options, c10::Device compute,
              std::unique_ptr<SpillFile> spill);
  ~OffloadCore();

  const OffloadOptions& options() const { return options_; }
  c10::Device compute() const { return compute_; }

  void Pack(const at::Tensor& t, bool exempt, PackedTensor* packed);
  at::Tensor Unpack(const PackedTensor& packed);

  void BeginStep(const std::vector<at::Tensor>& params_and_buffers);
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
  // Records released under mu_ go here, to be freed after it is released
  // (their destructor takes mu_).
  using Graveyard = std::vector<std::shared_ptr<StorageRecord>>;
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

  // Why `t` stays where it is; nullopt when it is to be offloaded.
  std::optional<SkipReason> Classify(const at::Tensor& t, bool exempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AccountAnchor(const at::Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Keep(const at::Tensor& t, bool account, PackedTensor* packed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies the parts of `span` that `record` does not cover yet; returns the
  // bytes that will move.
  int64_t Cover(const std::shared_ptr<StorageRecord>& record, const c10::Storage& storage,
                ByteSpan span, Graveyard* graveyard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartCopy(const std::shared_ptr<StorageRecord>& record, size_t index,
                 const c10::Storage& storage, Graveyard* graveyard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool WriterHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || stopping_;
  }
  bool WriterHasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ < options_.max_copies_in_flight;
  }
  bool WriterIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; }
  bool ReaderHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !prefetch_queue_.empty() || stopping_;
  }
  bool ReaderIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !reader_busy_; }
  // Drops the queued read-ahead and waits for the load under way: once
  // backward is over, what is left of it is of no use, and the reader must
  // not keep a released graph's record alive past this point.
  void QuiesceReader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the read-ahead of the prefetch_depth live records offloaded just
  // before `current` in forward (the ones backward needs next); starts the
  // reader thread the first time.
  void SchedulePrefetch(const StorageRecord& current, Graveyard* graveyard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReaderLoop();
  // Retires finished CUDA copies to host (all of them, waiting, if `all`),
  // and the oldest ones while more than max_copies_in_flight are in flight.
  void DrainStash(bool all, Graveyard* graveyard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishCopy(StorageRecord* record, size_t index, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddResident(int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetRecord(StorageRecord* record) ABSL_LOCKS_EXCLUDED(mu_);
  void WriterLoop();
  OffloadStats WithGauges(OffloadStats stats) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const OffloadOptions options_;
  const c10::Device compute_;
  const int prefetch_depth_;  // options_.prefetch_depth, auto resolved
  const std::unique_ptr<SpillFile> spill_;

  mutable absl::Mutex mu_;
  struct Entry {
    StorageRecord* raw = nullptr;
    std::weak_ptr<StorageRecord> weak;
  };
  absl::flat_hash_map<const c10::StorageImpl*, Entry> offloaded_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const c10::StorageImpl*, Entry> kept_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<const c10::StorageImpl*> params_ ABSL_GUARDED_BY(mu_);
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> param_refs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<uintptr_t, int>,
                      c10::weak_intrusive_ptr<c10::StorageImpl>>
      anchor_keys_ ABSL_GUARDED_BY(mu_);

  OffloadStats step_ ABSL_GUARDED_BY(mu_);
  OffloadStats totals_ ABSL_GUARDED_BY(mu_);
  int64_t resident_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t host_held_ ABSL_GUARDED_BY(mu_) = 0;

  std::deque<WriteJob> queue_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // queued or being written
  struct StashEntry {
    std::shared_ptr<StorageRecord> record;
    size_t segment;
  };
  std::deque<StashEntry> stash_ ABSL_GUARDED_BY(mu_);  // CUDA copies to host
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

#endif  // MEMPROFD_CORE_OFFLOAD_INTERNAL_OFFLOAD_CORE_H_
