#include "core/memory/meta_accounting.h"

#include <mutex>
#include <utility>

namespace memprofd {
namespace memory {
namespace {

// One accounted meta storage: its size, its attribution now, its sink.
struct MetaBlock {
  c10::DataPtr inner;
  int64_t bytes = 0;
  Attribution attribution;
  std::shared_ptr<MetaAllocationSink> sink;
};

std::shared_ptr<MetaAllocationSink>& ThisThreadSink() {
  thread_local std::shared_ptr<MetaAllocationSink> sink;
  return sink;
}

void FreeMetaBlock(void* context) {
  auto* block = static_cast<MetaBlock*>(context);
  block->sink->OnFree(block->bytes, block->attribution,
                      reinterpret_cast<uint64_t>(block));
  delete block;
}

class AccountingMetaAllocator final : public c10::Allocator {
 public:
  explicit AccountingMetaAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    const std::shared_ptr<MetaAllocationSink>& sink = ThisThreadSink();
    if (sink == nullptr) return base_->allocate(n);
    auto* block = new MetaBlock{base_->allocate(n), static_cast<int64_t>(n),
                                CurrentAttribution(), sink};
    sink->OnAlloc(block->bytes, block->attribution, reinterpret_cast<uint64_t>(block));
    void* data = block->inner.get();
    return {data, block, &FreeMetaBlock, c10::Device(c10::DeviceType::Meta)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* /*dest*/, const void* /*src*/,
                 std::size_t /*count*/) const override {}

 private:
  c10::Allocator* const base_;
};

AccountingMetaAllocator* g_allocator = nullptr;

MetaBlock* BlockOf(const c10::DataPtr& p) {
  if (p.get_deleter() != &FreeMetaBlock) return nullptr;
  return static_cast<MetaBlock*>(p.get_context());
}

}  // namespace

absl::Status InstallMetaAccounting() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_allocator = new AccountingMetaAllocator(c10::GetAllocator(c10::DeviceType::Meta));
    c10::SetAllocator(c10::DeviceType::Meta, g_allocator);
  });
  if (c10::GetAllocator(c10::DeviceType::Meta) != g_allocator) {
    return absl::InternalError(
        "meta accounting: another allocator replaced memprofd's on the meta device; a "
        "dry run would count nothing");
  }
  return absl::OkStatus();
}

MetaAccountingScope::MetaAccountingScope(std::shared_ptr<MetaAllocationSink> sink)
    : previous_(std::exchange(ThisThreadSink(), std::move(sink))) {}

MetaAccountingScope::~MetaAccountingScope() { ThisThreadSink() = std::move(previous_); }

std::optional<Attribution> MetaBlockAttribution(const c10::DataPtr& p) {
  const MetaBlock* block = BlockOf(p);
  if (block == nullptr) return std::nullopt;
  return block->attribution;
}

bool RetagMetaBlock(const c10::DataPtr& p, ModuleId module, Category category) {
  MetaBlock* block = BlockOf(p);
  if (block == nullptr) return false;
  Attribution to = block->attribution;
  to.module = module;
  to.category = category;
  block->sink->OnRetag(block->bytes, block->attribution, to,
                       reinterpret_cast<uint64_t>(block));
  block->attribution = to;
  return true;
}

}  // namespace memory
}  // namespace memprofd
