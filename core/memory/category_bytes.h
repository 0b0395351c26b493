#ifndef MEMPROFD_CORE_MEMORY_CATEGORY_BYTES_H_
#define MEMPROFD_CORE_MEMORY_CATEGORY_BYTES_H_

// Bytes per memory category (what the memory is for). Plain struct, no
// LibTorch. The session fills it from the attribution every allocation
// carries (MemoryRecorder::CategoryBytesOf), so the categories other than
// offloaded_host and offloaded_disk tile the compute device's allocator.

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
  int64_t saved_activations = 0;
  int64_t temporaries = 0;
  // Outside the compute device's allocator: the offloader's pinned host
  // copies and its spill file.
  int64_t offloaded_host = 0;
  int64_t offloaded_disk = 0;
  int64_t snapshot_staging = 0;
  int64_t other = 0;
  int64_t unknown = 0;
  // saved_activations + temporaries (what older releases reported as the
  // remainder); not in Named().
  int64_t activations_and_temporaries = 0;

  // (name, bytes) in a fixed order with the metric label names, which are
  // CategoryName()s: "parameters", "gradients", "optimizer_state",
  // "saved_activations", "temporaries", "offloaded_host", "offloaded_disk",
  // "snapshot_staging", "other", "unknown".
  std::vector<std::pair<std::string, int64_t>> Named() const {
    return {{"parameters", parameters},
            {"gradients", gradients},
            {"optimizer_state", optimizer_state},
            {"saved_activations", saved_activations},
            {"temporaries", temporaries},
            {"offloaded_host", offloaded_host},
            {"offloaded_disk", offloaded_disk},
            {"snapshot_staging", snapshot_staging},
            {"other", other},
            {"unknown", unknown}};
  }
};

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_CATEGORY_BYTES_H_
