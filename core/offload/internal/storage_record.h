#ifndef MEMPROFD_CORE_OFFLOAD_INTERNAL_STORAGE_RECORD_H_
#define MEMPROFD_CORE_OFFLOAD_INTERNAL_STORAGE_RECORD_H_

// The per-storage records that saved tensors point to: which bytes of a
// storage were copied off the compute device, where each copy lives, and how
// they come back. Private to core/offload.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/offload/internal/device_copy.h"

namespace memprofd::offload::internal {

class SavedTensorStore;

// Bytes [begin, end) of a storage.
struct ByteSpan {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// One block of an offloaded storage and where its copy lives.
struct Segment {
  ByteSpan span;
  at::Tensor host;           // host copy (kByte CPU tensor), or undefined
  int64_t file_offset = -1;  // extent in the spill file, or -1
  std::string error;         // why the copy out failed, if it did
  CopyDone cuda_done;        // CUDA copy to `host` in flight
  // A dry run's copy held in flight (MetaCopies::kInFlight): its source,
  // alive until the copy is retired, as a real copy's is.
  c10::Storage meta_source;
};

// Everything saved this step from one storage. Offloaded records own the
// copies of the covered spans (one copy per byte, whatever the number of
// views); kept records only account the device bytes that kept views hold
// alive. Shared by the hooks of all those views and freed with the last one.
// Holding a weak reference to the StorageImpl keeps its address from being
// reused while the record lives, so keying records by address has no ABA.
// Fields are guarded by the owning store's mutex.
class StorageRecord {
 public:
  StorageRecord(std::shared_ptr<SavedTensorStore> store, const c10::Storage& storage,
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
  friend class SavedTensorStore;

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

  const std::shared_ptr<SavedTensorStore> store_;
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
  // Offload effectiveness (offloaded records): references to the storage the
  // store itself holds (CPU sources of queued spill-file writes), whether the
  // record was decided, and how (see SavedTensorStore::DecideEffectiveness).
  int source_refs_ = 0;
  bool decided_ = false;
  bool effective_ = false;
  absl::Mutex reload_mu_;  // serializes loads of this record
};

}  // namespace memprofd::offload::internal

#endif  // MEMPROFD_CORE_OFFLOAD_INTERNAL_STORAGE_RECORD_H_
