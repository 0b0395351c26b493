#ifndef MEMPROFD_CORE_MEMORY_TAGGING_H_
#define MEMPROFD_CORE_MEMORY_TAGGING_H_

// Re-attribution of live storages, for bytes whose purpose becomes known
// after they were allocated: a storage autograd saves (the offloader's pack
// hook sees every one), a gradient that AccumulateGrad adopts, parameters
// created before they had a name. O(1) per call; no effect (false) on
// storages neither the counting CPU allocator nor, once attached, the CUDA
// accounting (cuda_stats.h) nor a dry run's meta accounting
// (meta_accounting.h) saw allocated (mmap-ed or from_blob storages,
// CUDA blocks from before the attach).

#include <ATen/core/Tensor.h>

#include <optional>

#include "core/common/attribution.h"

namespace memprofd {
namespace memory {

// Attributes the storage of `t` to `module` and `category`. The caller holds
// `t`; one thread at a time per storage. False for an undefined tensor, no
// storage, or a storage neither accounting saw allocated.
bool TagStorage(const at::Tensor& t, ModuleId module, Category category);

// Marks the storage of `t` as saved for backward: temporaries become
// saved_activations (module unchanged); parameters, gradients, optimizer
// state and everything else keep their category. True when it was re-tagged.
bool MarkSavedActivation(const at::Tensor& t);

// The attribution of the storage of `t`, when either accounting saw it
// allocated.
std::optional<Attribution> StorageAttribution(const at::Tensor& t);

// For its lifetime, attributes this thread's allocations to the module that
// `owner`'s storage is attributed to (none when no accounting saw it
// allocated) and to `category`: the optimizer state, gradient buffers and
// shards that belong to a parameter are counted under its module.
class OwnedByScope {
 public:
  OwnedByScope(const at::Tensor& owner, Category category)
      : module_(ModuleOf(owner)), category_(category) {}
  OwnedByScope(const OwnedByScope&) = delete;
  OwnedByScope& operator=(const OwnedByScope&) = delete;

 private:
  static ModuleId ModuleOf(const at::Tensor& owner) {
    const std::optional<Attribution> a = StorageAttribution(owner);
    return a ? a->module : 0;
  }
  ModuleScope module_;
  CategoryScope category_;
};

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_TAGGING_H_
