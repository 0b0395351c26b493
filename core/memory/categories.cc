#include "core/memory/categories.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"

namespace memprofd {
namespace memory {
namespace {

// Adds the bytes of storages not seen before; returns those on `device`.
int64_t Count(const std::vector<at::Tensor>& tensors, c10::DeviceType device,
              absl::flat_hash_set<const void*>& seen, int64_t& total) {
  int64_t on_device = 0;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    if (impl == nullptr || !seen.insert(impl).second) continue;
    const int64_t bytes = static_cast<int64_t>(impl->nbytes());
    total += bytes;
    if (impl->device_type() == device) on_device += bytes;
  }
  return on_device;
}

}  // namespace

CategoryBytes ComputeCategories(const CategoryInputs& in) {
  CategoryBytes out;
  absl::flat_hash_set<const void*> seen;
  int64_t on_device = 0;
  on_device += Count(in.parameters, in.allocator_device, seen, out.parameters);
  on_device +=
      Count(in.gathered_parameters, in.allocator_device, seen, out.gathered_parameters);
  on_device += Count(in.gradients, in.allocator_device, seen, out.gradients);
  on_device += Count(in.optimizer_state, in.allocator_device, seen, out.optimizer_state);
  out.offloaded_host = in.offloaded_host_bytes;
  out.offloaded_disk = in.offloaded_disk_bytes;
  out.snapshot_staging = in.snapshot_staging_bytes;
  out.activations_and_temporaries = std::max<int64_t>(
      0, in.allocator_total_bytes - on_device - in.external_bytes_in_allocator);
  return out;
}

}  // namespace memory
}  // namespace memprofd
