// Invariant 4: a snapshot's extra host memory is the staging buffer,
// independent of model size, measured at LibTorch's CPU allocator.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/snapshot/loader.h"
#include "core/snapshot/writer.h"
#include "gtest/gtest.h"
#include "tests/snapshot/test_util.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace snapshot {
namespace {

using ::memprofd::testing::TempDir;

// Wraps LibTorch's CPU allocator and counts live and peak bytes.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    auto* ctx = new Context{std::move(inner), n, this};
    const int64_t now =
        current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return c10::DataPtr(data, ctx, &Delete, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void ResetPeak() { peak_.store(current_.load()); }
  c10::Allocator* base() const { return base_; }

 private:
  struct Context {
    c10::DataPtr inner;
    size_t n;
    const CountingAllocator* owner;
  };
  static void Delete(void* p) {
    auto* ctx = static_cast<Context*>(p);
    ctx->owner->current_.fetch_sub(static_cast<int64_t>(ctx->n));
    delete ctx;
  }
  c10::Allocator* base_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
};

// Installs the counting allocator for the test's lifetime. It is never
// destroyed: tensors it allocated may outlive the test.
class MemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static CountingAllocator* const counting =
        new CountingAllocator(c10::GetCPUAllocator());
    counting_ = counting;
    c10::SetCPUAllocator(counting_, /*priority=*/100);
  }
  void TearDown() override { c10::SetCPUAllocator(counting_->base(), 100); }

  // Peak extra allocator bytes of writing `tensors`.
  int64_t PeakExtra(const TensorList& tensors, const SnapshotOptions& o,
                    const std::string& name, SnapshotManifest* manifest) {
    const int64_t baseline = counting_->current();
    counting_->ResetPeak();
    auto m = SnapshotWriter(root_.path()).Write(name, tensors, "{}", o);
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) *manifest = *m;
    EXPECT_EQ(counting_->current(), baseline) << "the writer leaked host memory";
    return counting_->peak() - baseline;
  }

  CountingAllocator* counting_ = nullptr;
  TempDir root_;
};

TEST_F(MemoryTest, ExtraHostMemoryIsTheStagingBufferForModelsFourTimesApart) {
  // Built after the allocator is installed: the models count in the baseline.
  const TensorList small = testing::MakeModel(1, 2, 128, 256);  // ~0.9 MB
  const TensorList large = testing::MakeModel(1, 8, 256, 512);  // ~4x
  int64_t small_bytes = 0, large_bytes = 0;
  for (const auto& [n, t] : small) small_bytes += t.nbytes();
  for (const auto& [n, t] : large) large_bytes += t.nbytes();
  ASSERT_GE(large_bytes, 4 * small_bytes);

  SnapshotOptions o;
  o.staging_bytes = 64 << 10;
  for (const SnapshotDtype dtype : {SnapshotDtype::kKeep, SnapshotDtype::kBFloat16}) {
    o.dtype = dtype;
    const std::string suffix(SnapshotDtypeName(dtype));
    SnapshotManifest ms, ml;
    const int64_t extra_small = PeakExtra(small, o, "small-" + suffix, &ms);
    const int64_t extra_large = PeakExtra(large, o, "large-" + suffix, &ml);
    // Host tensors already in the output dtype are written from their own
    // memory; a conversion streams through the staging buffer. Either way
    // the writer's own accounting and the allocator agree, and do not grow
    // with the model.
    const int64_t expected = dtype == SnapshotDtype::kKeep ? 0 : o.staging_bytes;
    EXPECT_EQ(ms.peak_extra_host_bytes, expected);
    EXPECT_EQ(ml.peak_extra_host_bytes, expected);
    EXPECT_EQ(ml.peak_extra_device_bytes, 0);
    EXPECT_EQ(extra_small, expected) << suffix;
    EXPECT_EQ(extra_large, expected) << suffix;
  }
}

TEST_F(MemoryTest, NonContiguousAndMappedSourcesAddNothing) {
  const TensorList model = testing::MakeModel(2, 4, 128, 256);
  TensorList views;
  for (const auto& [name, t] : model) {
    views.emplace_back(name, t.dim() == 2 ? t.t() : t);  // transposed views
  }
  SnapshotOptions o;
  o.staging_bytes = 16 << 10;
  o.dtype = SnapshotDtype::kFloat16;
  SnapshotManifest m;
  EXPECT_EQ(PeakExtra(views, o, "views", &m), o.staging_bytes);

  auto mapped = LoadSafetensorsDirectory(root_.Join("views"));
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  o.dtype = SnapshotDtype::kFloat32;
  EXPECT_EQ(PeakExtra(mapped->tensors, o, "from-disk", &m), o.staging_bytes);
  EXPECT_EQ(m.peak_extra_host_bytes, o.staging_bytes);
  o.dtype = SnapshotDtype::kKeep;  // mapped and already fp16: zero copy
  EXPECT_EQ(PeakExtra(mapped->tensors, o, "from-disk-keep", &m), 0);
  EXPECT_EQ(m.peak_extra_host_bytes, 0);
  auto back = LoadSafetensorsDirectory(root_.Join("from-disk"));
  ASSERT_TRUE(back.ok());
  std::map<std::string, at::Tensor> by_name(back->tensors.begin(), back->tensors.end());
  for (const auto& [name, t] : views) {
    EXPECT_TRUE(testing::BitEqual(t.to(at::kHalf).to(at::kFloat), by_name.at(name)))
        << name;
  }
}

TEST_F(MemoryTest, MixedPlacementStaysWithinStagingForModelsFourTimesApart) {
  // Layers held as CPU parameters, as non-contiguous views and as mapped
  // ("disk") tensors in one state dict, written as bf16: the extra host
  // memory is at most the staging buffer plus 1 MiB whatever the size.
  SnapshotOptions o;
  o.staging_bytes = 64 << 10;
  o.dtype = SnapshotDtype::kBFloat16;
  int64_t sizes[2] = {0, 0};
  int64_t extras[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const int layers = k == 0 ? 1 : 10;
    TensorList model = testing::MakeModel(3, layers, 128, 256);
    for (auto& [name, t] : model) sizes[k] += t.nbytes();
    // The second half of the state dict goes to "disk".
    const size_t half = model.size() / 2;
    TensorList disk(model.begin() + half, model.end());
    const std::string disk_name = k == 0 ? "disk-small" : "disk-large";
    SnapshotManifest m;
    PeakExtra(disk, SnapshotOptions(), disk_name, &m);
    auto mapped = LoadSafetensorsDirectory(root_.Join(disk_name));
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    std::map<std::string, at::Tensor> by_name(mapped->tensors.begin(),
                                              mapped->tensors.end());
    TensorList mixed;
    for (size_t i = 0; i < model.size(); ++i) {
      const auto& [name, t] = model[i];
      if (i >= half) {
        mixed.emplace_back(name, by_name.at(name));
      } else if (i % 2 == 0 && t.dim() == 2) {
        mixed.emplace_back(name, t.t());
      } else {
        mixed.emplace_back(name, t.detach().requires_grad_(true));
      }
    }
    extras[k] = PeakExtra(mixed, o, k == 0 ? "mixed-small" : "mixed-large", &m);
    EXPECT_EQ(m.peak_extra_host_bytes, o.staging_bytes);
    EXPECT_LE(extras[k], o.staging_bytes + (1 << 20));
  }
  EXPECT_GE(sizes[1], 4 * sizes[0]);
  EXPECT_EQ(extras[0], extras[1]);
}

// Tensors the writer reaches through a TensorAccess, as rank 0 reaches a
// fully sharded model's parameters: each "sharded" tensor's storage is freed
// (0 bytes, as ParameterSharding frees a parameter another rank owns), and
// Acquire refills it from `sources` (standing in for the owner's copy, which
// lives on another rank) into a fresh allocation, Release frees it again.
class RefillingAccess final : public TensorAccess {
 public:
  RefillingAccess(const TensorList& sharded, const TensorList& sources)
      : sharded_(sharded), sources_(sources) {}

  absl::StatusOr<int64_t> Acquire(size_t index) override {
    if (static_cast<int>(order.size()) == fail_at) {
      return absl::UnavailableError("the owner rank went away");
    }
    order.push_back(sharded_[index].first);
    ++held;
    most_held = std::max(most_held, held);
    c10::StorageImpl* storage = sharded_[index].second.storage().unsafeGetStorageImpl();
    const at::Tensor& source = sources_[index].second;
    const size_t bytes = source.nbytes();
    storage->set_data_ptr_noswap(c10::GetCPUAllocator()->allocate(bytes));
    storage->set_nbytes(bytes);
    std::memcpy(storage->mutable_data(), source.data_ptr(), bytes);
    return static_cast<int64_t>(bytes);
  }
  void Release(size_t index) override {
    --held;
    ++released;
    Free(sharded_[index].second);
  }
  static void Free(const at::Tensor& t) {
    c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(c10::DataPtr(nullptr, storage->device()));
    storage->set_nbytes(0);
  }

  std::vector<std::string> order;  // names acquired, in order
  int held = 0, most_held = 0, released = 0;
  int fail_at = -1;  // the Acquire (0-based) that fails; -1: none

 private:
  const TensorList& sharded_;
  const TensorList& sources_;
};

TEST_F(MemoryTest, TensorsGatheredOneAtATimeAddAtMostTheLargest) {
  const TensorList sources = testing::MakeModel(4, 3, 128, 256);
  TensorList sharded;
  int64_t largest = 0;
  for (const auto& [name, t] : sources) {
    at::Tensor empty = t.clone();
    RefillingAccess::Free(empty);
    sharded.emplace_back(name, empty);
    largest = std::max<int64_t>(largest, t.nbytes());
  }
  SnapshotOptions o;
  o.staging_bytes = 64 << 10;
  o.max_shard_size = 200 << 10;  // several files: the layout decides the order
  RefillingAccess access(sharded, sources);
  const int64_t baseline = counting_->current();
  counting_->ResetPeak();
  absl::StatusOr<SnapshotManifest> m =
      SnapshotWriter(root_.path())
          .Write("gathered", sharded, "{}", o, nullptr, nullptr, &access);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(counting_->current(), baseline) << "a gathered tensor was not freed";
  EXPECT_GT(m->num_shards, 1);
  // Each tensor once, one held at a time, each let go.
  EXPECT_EQ(access.order.size(), sources.size());
  EXPECT_EQ(std::set<std::string>(access.order.begin(), access.order.end()).size(),
            sources.size());
  EXPECT_EQ(access.most_held, 1);
  EXPECT_EQ(access.released, static_cast<int>(sources.size()));
  // Extra memory: the one tensor held (no staging: float32 kept as it is).
  EXPECT_EQ(m->peak_gathered_bytes, largest);
  EXPECT_EQ(m->peak_extra_host_bytes, 0);
  EXPECT_EQ(counting_->peak() - baseline, largest);
  auto back = LoadSafetensorsDirectory(root_.Join("gathered"));
  ASSERT_TRUE(back.ok()) << back.status();
  std::map<std::string, at::Tensor> by_name(back->tensors.begin(), back->tensors.end());
  for (const auto& [name, t] : sources) {
    EXPECT_TRUE(testing::BitEqual(t, by_name.at(name))) << name;
  }
  // The async mode's host copies go through the same access.
  RefillingAccess copying(sharded, sources);
  absl::StatusOr<AsyncSnapshotSource> copies =
      CopyForAsyncSnapshot(sharded, SnapshotOptions(), &copying);
  ASSERT_TRUE(copies.ok()) << copies.status();
  EXPECT_EQ(copying.most_held, 1);
  EXPECT_EQ(copying.released, static_cast<int>(sources.size()));
  for (size_t i = 0; i < sources.size(); ++i) {
    EXPECT_TRUE(testing::BitEqual(sources[i].second, copies->tensors[i].second))
        << sources[i].first;
  }
}

TEST_F(MemoryTest, AFailedGatherStopsTheWriteAndPublishesNothing) {
  const TensorList sources = testing::MakeModel(5, 2, 64, 128);
  TensorList sharded;
  for (const auto& [name, t] : sources) {
    at::Tensor empty = t.clone();
    RefillingAccess::Free(empty);
    sharded.emplace_back(name, empty);
  }
  RefillingAccess access(sharded, sources);
  access.fail_at = 2;
  const int64_t baseline = counting_->current();
  absl::StatusOr<SnapshotManifest> m =
      SnapshotWriter(root_.path())
          .Write("broken", sharded, "{}", SnapshotOptions(), nullptr, nullptr, &access);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable) << m.status();
  EXPECT_NE(m.status().message().find("owner rank"), std::string::npos) << m.status();
  EXPECT_EQ(access.order.size(), 2u);
  EXPECT_EQ(access.released, 2);  // what was acquired was let go
  EXPECT_EQ(counting_->current(), baseline);
  EXPECT_FALSE(std::filesystem::exists(root_.Join("broken")));
}

}  // namespace
}  // namespace snapshot
}  // namespace memprofd
