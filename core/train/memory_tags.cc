#include "core/train/memory_tags.h"

#include <ATen/ATen.h>

#include <set>

#include "core/common/attribution.h"
#include "core/memory/tagging.h"

namespace memprofd {

void TagModelMemory(const LlamaModel& model) {
  std::set<const void*> seen;
  for (const auto& [name, p] : model.NamedParameters()) {
    if (!p.has_storage() || !seen.insert(p.storage().unsafeGetStorageImpl()).second) {
      continue;  // The tied head: its storage is the embedding's.
    }
    const ModuleId module = InternModule(name);
    memory::TagStorage(
        p, module,
        p.requires_grad() ? Category::kParameters : Category::kFrozenParameters);
    if (p.requires_grad()) {
      // The gradient AccumulateGrad is about to adopt (or add into .grad).
      at::Tensor param = p;
      param.register_hook([module](const at::Tensor& grad) {
        memory::TagStorage(grad, module, Category::kGradients);
      });
    }
  }
  const ModuleId rotary = InternModule("model.rotary_emb");
  for (const at::Tensor& b : model.Buffers()) {
    memory::TagStorage(b, rotary, Category::kOther);
  }
}

}  // namespace memprofd
