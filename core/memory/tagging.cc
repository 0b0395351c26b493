#include "core/memory/tagging.h"

#include <c10/core/Storage.h>

#include <cstdint>

#include "core/memory/cpu_allocator.h"
#include "core/memory/meta_accounting.h"
#ifdef MEMPROFD_WITH_CUDA
#include "core/memory/cuda_stats.h"
#endif

namespace memprofd {
namespace memory {
namespace {

// The storage's DataPtr, or nullptr when there is none.
const c10::DataPtr* DataPtrOf(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  if (impl == nullptr) return nullptr;
  return &impl->data_ptr();
}

// The block's attribution from whichever allocator made it: the counting
// CPU allocator's header, the CUDA caching allocator's tracked blocks, or a
// dry run's meta block (meta_accounting.h).
std::optional<Attribution> BlockAttribution(const c10::DataPtr& p) {
  if (p.device().is_meta()) return MetaBlockAttribution(p);
#ifdef MEMPROFD_WITH_CUDA
  if (p.device().is_cuda()) {
    return CudaBlockAttribution(p.device().index(), reinterpret_cast<uint64_t>(p.get()));
  }
#endif
  return CpuBlockAttribution(p.get(), p.get_deleter());
}

bool RetagBlock(const c10::DataPtr& p, ModuleId module, Category category) {
  if (p.device().is_meta()) return RetagMetaBlock(p, module, category);
#ifdef MEMPROFD_WITH_CUDA
  if (p.device().is_cuda()) {
    return RetagCudaBlock(p.device().index(), reinterpret_cast<uint64_t>(p.get()), module,
                          category);
  }
#endif
  return RetagCpuBlock(p.get(), p.get_deleter(), module, category);
}

}  // namespace

bool TagStorage(const at::Tensor& t, ModuleId module, Category category) {
  const c10::DataPtr* p = DataPtrOf(t);
  if (p == nullptr) return false;
  return RetagBlock(*p, module, category);
}

bool MarkSavedActivation(const at::Tensor& t) {
  const c10::DataPtr* p = DataPtrOf(t);
  if (p == nullptr) return false;
  const std::optional<Attribution> a = BlockAttribution(*p);
  if (!a || a->category != Category::kTemporaries) return false;
  return RetagBlock(*p, a->module, Category::kSavedActivations);
}

std::optional<Attribution> StorageAttribution(const at::Tensor& t) {
  const c10::DataPtr* p = DataPtrOf(t);
  if (p == nullptr) return std::nullopt;
  return BlockAttribution(*p);
}

}  // namespace memory
}  // namespace memprofd
