#include "core/memory/tagging.h"

#include <c10/core/Storage.h>

#include "core/memory/cpu_allocator.h"

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

}  // namespace

bool TagStorage(const at::Tensor& t, ModuleId module, Category category) {
  const c10::DataPtr* p = DataPtrOf(t);
  if (p == nullptr) return false;
  return RetagCpuBlock(p->get(), p->get_deleter(), module, category);
}

bool MarkSavedActivation(const at::Tensor& t) {
  const c10::DataPtr* p = DataPtrOf(t);
  if (p == nullptr) return false;
  const std::optional<Attribution> a = CpuBlockAttribution(p->get(), p->get_deleter());
  if (!a || a->category != Category::kTemporaries) return false;
  return RetagCpuBlock(p->get(), p->get_deleter(), a->module,
                       Category::kSavedActivations);
}

std::optional<Attribution> StorageAttribution(const at::Tensor& t) {
  const c10::DataPtr* p = DataPtrOf(t);
  if (p == nullptr) return std::nullopt;
  return CpuBlockAttribution(p->get(), p->get_deleter());
}

}  // namespace memory
}  // namespace memprofd
