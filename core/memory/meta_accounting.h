#ifndef MEMPROFD_CORE_MEMORY_META_ACCOUNTING_H_
#define MEMPROFD_CORE_MEMORY_META_ACCOUNTING_H_

// Accounting of meta-device storages, for dry runs (core/plan). A meta tensor
// has a shape and no data, but its storage still comes from the allocator
// registered for c10::DeviceType::Meta: a step run on meta allocates and frees
// the storages its real run would, each op's outputs (what a kernel allocates
// inside itself and frees before returning is not seen).
//
// InstallMetaAccounting() wraps that allocator once per process. A storage
// allocated on a thread inside a MetaAccountingScope is told to the scope's
// sink with the thread's CurrentAttribution() (module, op, category, and the
// phase and step of the thread's PhaseDomain), and its free, on whichever
// thread, to the same sink with the attribution the block has then (after
// re-tags: tagging.h re-attributes meta blocks as it does CPU and CUDA ones).
// Storages allocated outside any scope are the base allocator's, unseen.
// Nothing here touches the process's recorder: a dry run beside a training
// never reaches its categories.

#include <c10/core/Allocator.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "core/common/attribution.h"

namespace memprofd {
namespace memory {

// Receives the events of the meta storages allocated inside a scope. Calls
// come from the allocating or freeing thread, possibly several at once:
// implementations synchronise. A block's free and re-tags name the
// attribution it has at that moment.
class MetaAllocationSink {
 public:
  virtual ~MetaAllocationSink() = default;
  // `id` names the storage until its free (unique among live ones): for a
  // sink that replays the allocator's blocks.
  virtual void OnAlloc(int64_t bytes, const Attribution& block, uint64_t id) = 0;
  virtual void OnFree(int64_t bytes, const Attribution& block, uint64_t id) = 0;
  // The block of `bytes` (allocation `id`) attributed to `from` is now
  // attributed to `to`.
  virtual void OnRetag(int64_t bytes, const Attribution& from, const Attribution& to,
                       uint64_t id) = 0;
};

// Wraps the meta allocator (once; idempotent, thread-safe). INTERNAL when
// another allocator replaced it since (nothing would be counted).
absl::Status InstallMetaAccounting();

// Sends this thread's meta allocations to `sink` for the scope's lifetime
// (nests; the innermost wins). The sink is kept alive by every block it saw,
// so blocks freed after the scope still reach it. Create and destroy on one
// thread. InstallMetaAccounting() must have succeeded.
class MetaAccountingScope {
 public:
  explicit MetaAccountingScope(std::shared_ptr<MetaAllocationSink> sink);
  ~MetaAccountingScope();
  MetaAccountingScope(const MetaAccountingScope&) = delete;
  MetaAccountingScope& operator=(const MetaAccountingScope&) = delete;

 private:
  std::shared_ptr<MetaAllocationSink> previous_;
};

// The attribution of the meta block `p` (a storage's DataPtr), or nullopt
// when no scope saw it allocated. The caller holds the storage.
std::optional<Attribution> MetaBlockAttribution(const c10::DataPtr& p);
// Re-attributes such a block (its sink is told); false when no scope saw it.
// One thread at a time per block.
bool RetagMetaBlock(const c10::DataPtr& p, ModuleId module, Category category);

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_META_ACCOUNTING_H_
