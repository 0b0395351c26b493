#ifndef MEMPROFD_CORE_OFFLOAD_INTERNAL_TRL_BASELINE_H_
#define MEMPROFD_CORE_OFFLOAD_INTERNAL_TRL_BASELINE_H_

// The TRL baseline: what TRL's activation offloader would have copied off the
// compute device for the same saved tensors, reported next to what this
// offloader moved (OffloadStats::trl_baseline_bytes_out). Accounting only:
// nothing here moves or keeps a tensor. Private to core/offload.

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace memprofd::offload::internal {

// One step's TRL-baseline accounting. TRL's pack hook compares a tensor's
// logical size (numel * element size) with the threshold, keys it by (pointer
// of its first element, dtype), and copies the whole storage for a broadcast
// view and a compact clone of any other view. This class credits that key its
// best: a key hit counts only while it is the same live storage, so the
// address-reuse false hits of TRL's key (trl#6241) are not counted as dedup.
// Not thread-safe: the store calls it under its mutex.
class TrlBaseline {
 public:
  // Bytes TRL would copy off for saved tensor `t` (which has a storage): 0
  // below `min_offload_bytes` or for a key already seen on the same storage
  // this step.
  int64_t BytesOut(const at::Tensor& t, int64_t min_offload_bytes);
  // Forgets the step's keys (a new step starts).
  void Reset() { keys_.clear(); }

 private:
  // (first element's address, dtype) -> the storage it was seen on.
  absl::flat_hash_map<std::pair<uintptr_t, int>,
                      c10::weak_intrusive_ptr<c10::StorageImpl>>
      keys_;
};

}  // namespace memprofd::offload::internal

#endif  // MEMPROFD_CORE_OFFLOAD_INTERNAL_TRL_BASELINE_H_
