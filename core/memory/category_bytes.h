#ifndef MEMPROFD_CORE_MEMORY_CATEGORY_BYTES_H_
#define MEMPROFD_CORE_MEMORY_CATEGORY_BYTES_H_

// Bytes per memory category (what the memory is for). Plain struct, no
// LibTorch; computed by ComputeCategories() in categories.h.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace memprofd {
namespace memory {

struct CategoryBytes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t offloaded_host = 0;
  int64_t offloaded_disk = 0;
  int64_t snapshot_staging = 0;
  // The allocator's total on the measured device minus everything above that
  // lives there, clamped at 0.
  int64_t activations_and_temporaries = 0;

  // (name, bytes) in a fixed order with the metric label names: "parameters",
  // "gradients", "optimizer_state", "offloaded_host", "offloaded_disk",
  // "snapshot_staging", "activations_and_temporaries".
  std::vector<std::pair<std::string, int64_t>> Named() const {
    return {{"parameters", parameters},
            {"gradients", gradients},
            {"optimizer_state", optimizer_state},
            {"offloaded_host", offloaded_host},
            {"offloaded_disk", offloaded_disk},
            {"snapshot_staging", snapshot_staging},
            {"activations_and_temporaries", activations_and_temporaries}};
  }
};

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_CATEGORY_BYTES_H_
