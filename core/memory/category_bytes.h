#ifndef MEMPROFD_CORE_MEMORY_CATEGORY_BYTES_H_
#define MEMPROFD_CORE_MEMORY_CATEGORY_BYTES_H_

// Bytes per memory category (what the memory is for). Plain struct, no
// LibTorch. The session fills it from the attribution every allocation
// carries (MemoryRecorder::CategoryBytesOf), so the categories other than
// offloaded_host and offloaded_disk tile the compute device's allocator.

#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "core/common/attribution.h"

namespace memprofd {
namespace memory {

struct CategoryBytes {
  int64_t parameters = 0;
  // Parameters that do not train (a LoRA model's frozen base).
  int64_t frozen_parameters = 0;
  // Parameters a fully sharded data-parallel rank gathered from their
  // owners, while a unit of the model runs (its own shards are parameters).
  int64_t gathered_parameters = 0;
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
  // remainder); not in Named(), no Category of its own.
  int64_t activations_and_temporaries = 0;

  // The order of Named(): every Category once, model state first.
  static constexpr Category kNamedOrder[] = {Category::kParameters,
                                             Category::kFrozenParameters,
                                             Category::kGatheredParameters,
                                             Category::kGradients,
                                             Category::kOptimizerState,
                                             Category::kSavedActivations,
                                             Category::kTemporaries,
                                             Category::kOffloadedHost,
                                             Category::kOffloadedDisk,
                                             Category::kSnapshotStaging,
                                             Category::kOther,
                                             Category::kUnknown};
  static_assert(std::size(kNamedOrder) == kNumCategories,
                "every Category needs its place in kNamedOrder");

  // The field that holds `category`'s bytes (unknown for a value outside the
  // enum).
  int64_t& Of(Category category) {
    return const_cast<int64_t&>(std::as_const(*this).Of(category));
  }
  const int64_t& Of(Category category) const {
    // No default: -Wswitch names a Category left without its field.
    switch (category) {
      case Category::kParameters:
        return parameters;
      case Category::kFrozenParameters:
        return frozen_parameters;
      case Category::kGatheredParameters:
        return gathered_parameters;
      case Category::kGradients:
        return gradients;
      case Category::kOptimizerState:
        return optimizer_state;
      case Category::kSavedActivations:
        return saved_activations;
      case Category::kTemporaries:
        return temporaries;
      case Category::kOffloadedHost:
        return offloaded_host;
      case Category::kOffloadedDisk:
        return offloaded_disk;
      case Category::kSnapshotStaging:
        return snapshot_staging;
      case Category::kOther:
        return other;
      case Category::kUnknown:
        return unknown;
    }
    return unknown;
  }

  // (name, bytes) of every category in kNamedOrder, named by CategoryName()
  // (the metric label names): "parameters", "frozen_parameters",
  // "gathered_parameters",
  // "gradients", "optimizer_state", "saved_activations", "temporaries",
  // "offloaded_host", "offloaded_disk", "snapshot_staging", "other",
  // "unknown".
  std::vector<std::pair<std::string, int64_t>> Named() const {
    std::vector<std::pair<std::string, int64_t>> out;
    out.reserve(std::size(kNamedOrder));
    for (const Category c : kNamedOrder) out.emplace_back(CategoryName(c), Of(c));
    return out;
  }
};

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_CATEGORY_BYTES_H_
