#ifndef MEMPROFD_CORE_MEMORY_CATEGORIES_H_
#define MEMPROFD_CORE_MEMORY_CATEGORIES_H_

// Attribution of a device's allocated bytes to categories.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "core/memory/category_bytes.h"

namespace memprofd {
namespace memory {

struct CategoryInputs {
  std::vector<at::Tensor> parameters;
  // Fully sharded data parallel: what this rank gathered from the owners.
  std::vector<at::Tensor> gathered_parameters;
  std::vector<at::Tensor> gradients;  // Undefined tensors are skipped.
  std::vector<at::Tensor> optimizer_state;
  // From the offloader and the snapshot writer, in bytes.
  int64_t offloaded_host_bytes = 0;
  int64_t offloaded_disk_bytes = 0;
  int64_t snapshot_staging_bytes = 0;
  // How much of offloaded_host_bytes and snapshot_staging_bytes lives in
  // memory the measured allocator counts (host tensors on a CPU-only build),
  // and so must not be counted again as activations.
  int64_t external_bytes_in_allocator = 0;
  // The allocator being attributed: its device type and current bytes
  // (MemoryRecorder::CurrentBytes()).
  c10::DeviceType allocator_device = c10::DeviceType::CPU;
  int64_t allocator_total_bytes = 0;
};

// Exact bytes per category: each distinct storage (StorageImpl) counts once,
// at its full nbytes(), in the first category that holds it (parameters, then
// gathered parameters, then gradients, then optimizer state) — views and tied
// weights are not counted twice. activations_and_temporaries =
// allocator_total_bytes minus the storages above on allocator_device minus
// external_bytes_in_allocator, clamped at 0.
// Call on the owner thread (it reads tensors the trainer owns). No LibTorch
// call here can throw.
CategoryBytes ComputeCategories(const CategoryInputs& inputs);

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_CATEGORIES_H_
