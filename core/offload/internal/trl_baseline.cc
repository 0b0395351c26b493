// TrlBaseline: the bytes TRL's activation offloader would move for each saved
// tensor, computed as its pack hook does.

#include "core/offload/internal/trl_baseline.h"

namespace memprofd::offload::internal {

int64_t TrlBaseline::BytesOut(const at::Tensor& t, int64_t min_offload_bytes) {
  const int64_t element = static_cast<int64_t>(t.element_size());
  const int64_t logical = t.numel() * element;
  if (logical < min_offload_bytes) return 0;
  const auto base = reinterpret_cast<uintptr_t>(t.storage().data());
  const std::pair<uintptr_t, int> key(base + t.storage_offset() * element,
                                      static_cast<int>(t.scalar_type()));
  const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  auto [it, inserted] = keys_.try_emplace(key, t.storage().getWeakStorageImpl());
  if (!inserted) {
    if (it->second._unsafe_get_target() == impl && it->second.use_count() > 0) return 0;
    it->second = t.storage().getWeakStorageImpl();
  }
  bool broadcast = false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    broadcast |= t.stride(d) == 0 && t.size(d) > 1;
  }
  return broadcast ? static_cast<int64_t>(t.storage().nbytes()) : logical;
}

}  // namespace memprofd::offload::internal
