// The meta device's accounting for dry runs: storages made inside a scope
// reach its sink with their attribution, re-tags and frees follow them, and
// nothing made outside a scope (or on another thread) is seen.

#include "core/memory/meta_accounting.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <thread>

#include "core/common/attribution.h"
#include "core/memory/tagging.h"

namespace memprofd::memory {
namespace {

class CountingSink final : public MetaAllocationSink {
 public:
  void OnAlloc(int64_t bytes, const Attribution& block, uint64_t /*id*/) override {
    std::lock_guard<std::mutex> lock(mu);
    live += bytes;
    ++allocs;
    last = block;
  }
  void OnFree(int64_t bytes, const Attribution& block, uint64_t /*id*/) override {
    std::lock_guard<std::mutex> lock(mu);
    live -= bytes;
    ++frees;
    last_freed = block;
  }
  void OnRetag(int64_t bytes, const Attribution& /*from*/, const Attribution& to,
               uint64_t /*id*/) override {
    std::lock_guard<std::mutex> lock(mu);
    retagged += bytes;
    last = to;
  }
  std::mutex mu;
  int64_t live = 0, allocs = 0, frees = 0, retagged = 0;
  Attribution last, last_freed;
};

at::TensorOptions Meta() {
  return at::TensorOptions().dtype(at::kFloat).device(at::kMeta);
}

TEST(MetaAccountingTest, ScopedStoragesReachTheSinkWithTheirAttributionUntilFreed) {
  ASSERT_TRUE(InstallMetaAccounting().ok());
  auto sink = std::make_shared<CountingSink>();
  const ModuleId module = InternModule("model.layers.0.mlp");
  at::Tensor kept;
  {
    MetaAccountingScope scope(sink);
    ModuleScope in_module(module);
    CategoryScope optimizer(Category::kOptimizerState);
    kept = at::empty({16, 4}, Meta());
    EXPECT_EQ(sink->live, 256);
    EXPECT_EQ(sink->last.module, module);
    EXPECT_EQ(sink->last.category, Category::kOptimizerState);
    // Re-tagged as the trainer tags gradients: the block follows.
    ASSERT_TRUE(TagStorage(kept, module, Category::kGradients));
    EXPECT_EQ(sink->retagged, 256);
    EXPECT_EQ(StorageAttribution(kept)->category, Category::kGradients);
  }
  // Outside the scope (and on another thread inside none), unseen.
  at::Tensor unseen = at::empty({1024}, Meta());
  std::thread([] { at::Tensor other = at::empty({1024}, Meta()); }).join();
  EXPECT_EQ(sink->allocs, 1);
  EXPECT_FALSE(StorageAttribution(unseen).has_value());
  // A block freed after its scope still reaches its sink, as re-tagged.
  kept.reset();
  EXPECT_EQ(sink->live, 0);
  EXPECT_EQ(sink->frees, 1);
  EXPECT_EQ(sink->last_freed.category, Category::kGradients);
}

TEST(MetaAccountingTest, InstallIsIdempotent) {
  EXPECT_TRUE(InstallMetaAccounting().ok());
  EXPECT_TRUE(InstallMetaAccounting().ok());
}

}  // namespace
}  // namespace memprofd::memory
