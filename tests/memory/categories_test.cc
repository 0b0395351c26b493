#include "core/memory/categories.h"

#include <ATen/ATen.h>

#include <optional>
#include <set>
#include <string>

#include "core/common/attribution.h"
#include "core/memory/recorder.h"
#include "gtest/gtest.h"
#include "tests/memory/test_util.h"

namespace memprofd {
namespace memory {
namespace {

TEST(CategoriesTest, CountsEachStorageOnceAndTheRestAsActivations) {
  EnsureAccountingInstalled();
  MemoryRecorder& r = MemoryRecorder::Global();
  at::Tensor w1 = at::zeros({10, 10});       // 400 bytes
  at::Tensor b1 = at::zeros({10});           // 40
  at::Tensor gathered = at::zeros({5, 10});  // 200
  at::Tensor g1 = at::zeros({10, 10});       // 400
  at::Tensor m1 = at::zeros({10, 10});       // 400
  at::Tensor v1 = at::zeros({10, 10});       // 400
  at::Tensor activation = at::zeros({25});   // 100, uncategorised

  CategoryInputs in;
  // A view and a tied weight share w1's storage: counted once.
  in.parameters = {w1, b1, w1.t(), w1.narrow(0, 0, 2), w1};
  // A gathered parameter's views count once; one already a parameter, not again.
  in.gathered_parameters = {gathered, gathered.view({50}), b1};
  in.gradients = {g1, at::Tensor()};  // undefined grads are skipped
  in.optimizer_state = {m1, v1, w1};  // a storage already counted as a parameter
  in.offloaded_host_bytes = 123;
  in.offloaded_disk_bytes = 456;
  in.snapshot_staging_bytes = 789;
  in.allocator_total_bytes = r.CurrentBytes(kCpuDevice);
  const CategoryBytes c = ComputeCategories(in);
  EXPECT_EQ(c.parameters, 440);
  EXPECT_EQ(c.gathered_parameters, 200);
  EXPECT_EQ(c.gradients, 400);
  EXPECT_EQ(c.optimizer_state, 800);
  EXPECT_EQ(c.offloaded_host, 123);
  EXPECT_EQ(c.offloaded_disk, 456);
  EXPECT_EQ(c.snapshot_staging, 789);
  EXPECT_GE(c.activations_and_temporaries, 100);
  // The categories on the allocator's device sum to its total.
  EXPECT_EQ(c.parameters + c.gathered_parameters + c.gradients + c.optimizer_state +
                c.activations_and_temporaries,
            in.allocator_total_bytes);

  // Bytes the caller says live in the allocator are not activations.
  in.external_bytes_in_allocator = 60;
  EXPECT_EQ(ComputeCategories(in).activations_and_temporaries,
            c.activations_and_temporaries - 60);

  // Tensors on another device count in their category but not against
  // this allocator.
  in.external_bytes_in_allocator = 0;
  in.allocator_device = c10::DeviceType::CUDA;
  in.allocator_total_bytes = 1000;
  const CategoryBytes other = ComputeCategories(in);
  EXPECT_EQ(other.parameters, 440);
  EXPECT_EQ(other.activations_and_temporaries, 1000);
}

TEST(CategoriesTest, RemainderIsClampedAtZero) {
  CategoryInputs in;
  in.parameters = {at::zeros({100})};
  in.allocator_total_bytes = 10;  // e.g. storages allocated before install
  EXPECT_EQ(ComputeCategories(in).activations_and_temporaries, 0);
}

TEST(CategoriesTest, NamesAreTheMetricLabelsAndTheAttributionCategories) {
  CategoryBytes c;
  for (int i = 0; i < kNumCategories; ++i) c.Of(static_cast<Category>(i)) = 100 + i;
  EXPECT_EQ(c.parameters, 100 + static_cast<int>(Category::kParameters));
  EXPECT_EQ(c.gathered_parameters, 100 + static_cast<int>(Category::kGatheredParameters));
  EXPECT_EQ(c.frozen_parameters, 100 + static_cast<int>(Category::kFrozenParameters));
  EXPECT_EQ(c.unknown, 100 + static_cast<int>(Category::kUnknown));
  EXPECT_EQ(c.activations_and_temporaries, 0);  // no Category of its own
  const auto named = c.Named();
  ASSERT_EQ(named.size(), static_cast<size_t>(kNumCategories));
  // Model state first, in a fixed order.
  EXPECT_EQ(named[0].first, "parameters");
  EXPECT_EQ(named[1].first, "frozen_parameters");
  EXPECT_EQ(named[2].first, "gathered_parameters");
  EXPECT_EQ(named[3].first, "gradients");
  EXPECT_EQ(named[4].first, "optimizer_state");
  EXPECT_EQ(named.back().first, "unknown");
  // Every Category once, by its CategoryName, with its own field's bytes.
  std::set<Category> seen;
  for (const auto& [name, bytes] : named) {
    const std::optional<Category> category = CategoryFromName(name);
    ASSERT_TRUE(category.has_value()) << name;
    EXPECT_EQ(bytes, 100 + static_cast<int>(*category)) << name;
    seen.insert(*category);
  }
  EXPECT_EQ(seen.size(), named.size());
}

}  // namespace
}  // namespace memory
}  // namespace memprofd
