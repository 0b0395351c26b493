// Lifetimes, options and memory: nothing outlives the graph, the scope is
// per thread, and offloading to disk removes saved activations from memory.
// Each test that offloads also checks that the bytes really left (bytes_out,
// what the spill file holds, resident saved bytes) and came back (bytes_in),
// so none passes with an offloader that silently keeps everything.

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/offload/offloader.h"
#include "offload_test_util.h"

namespace memprofd::offload {
namespace {

using ::memprofd::offload::testing::MakeOffloader;

TEST(OffloadLifecycleTest, CreateRejectsBadOptions) {
  OffloadOptions options;
  options.enabled = true;
  options.max_copies_in_flight = 0;
  EXPECT_EQ(Offloader::Create(options, c10::Device(c10::kCPU)).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.max_copies_in_flight = 5;
  options.min_offload_bytes = -1;
  EXPECT_EQ(Offloader::Create(options, c10::Device(c10::kCPU)).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.min_offload_bytes = 0;
  options.spill_dir = "/nonexistent/memprofd";
  EXPECT_FALSE(Offloader::Create(options, c10::Device(c10::kCPU)).ok());
  options.spill_dir = "/tmp";
  EXPECT_TRUE(Offloader::Create(options, c10::Device(c10::kCPU)).ok());
#ifndef MEMPROFD_WITH_CUDA
  EXPECT_EQ(Offloader::Create(options, c10::Device(c10::kCUDA, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
#endif
  EXPECT_TRUE(InstallOffloadEngine().ok());  // idempotent
}

TEST(OffloadLifecycleTest, UnusedBranchFreesEverything) {
  torch::manual_seed(5);
  torch::nn::Linear used(8, 8);
  torch::nn::Linear unused(8, 8);
  const at::Tensor x = torch::randn({4, 8});
  std::vector<at::Tensor> params = used->parameters();
  for (const at::Tensor& p : unused->parameters()) params.push_back(p);
  for (const Target target : {Target::kDisk, Target::kHost}) {
    auto offloader = MakeOffloader(target, 0);
    for (int step = 0; step < 3; ++step) {
      offloader->BeginStep(params);
      at::Tensor loss;
      at::Tensor dead;
      {
        OffloadScope scope(offloader.get());
        at::Tensor h = torch::tanh(x * 2);
        loss = torch::relu(used->forward(h)).sum();
        dead = torch::sigmoid(unused->forward(h * h)).sum();  // never backwarded
      }
      loss.backward();
      offloader->Flush();
      // The unused branch still holds its saved tensors: in the spill file
      // with the disk target, on the device with the host one (a CPU device
      // is the host target already)...
      if (target == Target::kDisk) {
        EXPECT_GT(offloader->disk_bytes_held(), 0);
      } else {
        EXPECT_GT(offloader->resident_saved_bytes(), 0);
        EXPECT_EQ(offloader->disk_bytes_held(), 0);
      }
      dead.reset();
      loss.reset();
      // ...and gives everything back with its graph.
      EXPECT_EQ(offloader->disk_bytes_held(), 0);
      EXPECT_EQ(offloader->spill_file_bytes(), 0);
      EXPECT_EQ(offloader->host_bytes_held(), 0);
      EXPECT_EQ(offloader->resident_saved_bytes(), 0);
      const OffloadStats stats = offloader->EndStep();
      if (target == Target::kDisk) {
        EXPECT_GT(stats.tensors_offloaded, 0);
        EXPECT_GT(stats.bytes_out, 0);
        EXPECT_GT(stats.bytes_in, 0);  // the used branch's backward read back
      } else {
        EXPECT_GT(stats.skipped_of(SkipReason::kOnTarget), 0);
        EXPECT_EQ(stats.bytes_out, 0);
      }
    }
  }
}

TEST(OffloadLifecycleTest, SavedTensorsOutliveTheOffloader) {
  at::Tensor w = torch::randn({32, 32}, torch::requires_grad());
  at::Tensor loss;
  {
    auto offloader = MakeOffloader(Target::kDisk, 0);
    offloader->BeginStep({w});
    OffloadScope scope(offloader.get());
    loss = torch::exp(torch::mm(torch::ones({4, 32}) * 0.01, w)).sum();
    // mm's input and exp's result are in the spill file, not in memory, when
    // the offloader goes: backward reads them through what they kept.
    offloader->Flush();
    EXPECT_EQ(offloader->Totals().bytes_out, 2 * 4 * 32 * 4);
    EXPECT_EQ(offloader->disk_bytes_held(), 2 * 4 * 32 * 4);
    EXPECT_EQ(offloader->resident_saved_bytes(), 0);
  }
  loss.backward();
  at::Tensor expected = w.grad().clone();
  w.mutable_grad().reset();
  torch::exp(torch::mm(torch::ones({4, 32}) * 0.01, w)).sum().backward();
  EXPECT_TRUE(torch::equal(expected, w.grad()));
}

TEST(OffloadLifecycleTest, ScopeIsPerThreadAndNullIsANoOp) {
  auto offloader = MakeOffloader(Target::kDisk, 0);
  at::Tensor a = torch::randn({16, 16}, torch::requires_grad());
  offloader->BeginStep({a});
  {
    OffloadScope scope(offloader.get());
    std::thread other([&] { torch::exp(a * 2).sum().backward(); });
    other.join();
    {
      OffloadScope none(nullptr);  // keeps the enclosing scope
      torch::exp(a * 2).sum().backward();
    }
  }
  torch::exp(a * 2).sum().backward();  // outside any scope
  const OffloadStats stats = offloader->EndStep();
  // Only the exp result of the forward on this thread inside the (null,
  // hence still enclosing) scope; not the other thread's, not the unscoped one.
  EXPECT_EQ(stats.tensors_offloaded, 1);
  EXPECT_EQ(stats.tensors_seen, 1);
  EXPECT_EQ(stats.bytes_out, 16 * 16 * 4);
  EXPECT_EQ(stats.bytes_in, stats.bytes_out);
  const OffloadStats totals = offloader->Totals();
  EXPECT_EQ(totals.tensors_offloaded, 1);
  EXPECT_EQ(offloader->EndStep().tensors_seen, 0);  // counters restart per step
}

TEST(OffloadLifecycleTest, HeadScopeAfterTheBodyScopeIsAccountedNotMoved) {
  auto offloader = MakeOffloader(Target::kDisk, 0);
  at::Tensor w = torch::randn({16, 16}, torch::requires_grad());
  offloader->BeginStep({w});
  at::Tensor hidden;
  {
    auto body = std::make_shared<OffloadScope>(offloader.get());  // as StepHooks do
    hidden = torch::tanh(torch::mm(torch::ones({4, 16}), w));
  }
  at::Tensor loss;
  {
    auto head = std::make_shared<NoOffloadScope>(offloader.get());
    loss = torch::exp(hidden).sum();
  }
  offloader->Flush();  // the body's blocks are written: only the head's remain
  EXPECT_EQ(offloader->resident_saved_bytes(), 4 * 16 * 4);  // exp's result, kept
  EXPECT_EQ(offloader->disk_bytes_held(), 2 * 4 * 16 * 4);   // the body's two
  loss.backward();
  const OffloadStats stats = offloader->EndStep();
  EXPECT_EQ(stats.tensors_offloaded, 2);  // mm's input, tanh's result
  EXPECT_EQ(stats.bytes_out, 2 * 4 * 16 * 4);
  EXPECT_EQ(stats.bytes_in, stats.bytes_out);
  EXPECT_EQ(stats.skipped_of(SkipReason::kExempt), 1);
  {
    NoOffloadScope unrelated;  // no offloader, no enclosing scope: nothing seen
    torch::exp(w).sum().backward();
  }
  EXPECT_EQ(offloader->EndStep().tensors_seen, 0);
}

TEST(OffloadLifecycleTest, BackwardOnAnotherThreadUnpacks) {
  // Unpack finds its offloader through the hooks object, not the thread.
  at::Tensor w = torch::randn({64, 64}, torch::requires_grad());
  auto forward = [&] {
    return torch::tanh(torch::mm(torch::ones({8, 64}) * 0.1, w)).sum();
  };
  forward().backward();
  const at::Tensor expected = w.grad().clone();
  w.mutable_grad().reset();
  auto offloader = MakeOffloader(Target::kDisk, 0);
  offloader->BeginStep({w});
  at::Tensor loss;
  {
    OffloadScope scope(offloader.get());
    loss = forward();
  }
  std::thread worker([&] { loss.backward(); });
  worker.join();
  const OffloadStats stats = offloader->EndStep();
  EXPECT_EQ(stats.bytes_out, 2 * 8 * 64 * 4);  // mm's input, tanh's result
  EXPECT_EQ(stats.bytes_in, stats.bytes_out);
  EXPECT_TRUE(torch::equal(w.grad(), expected));
}

TEST(OffloadLifecycleTest, DisabledAccountsWhatEnabledMoves) {
  at::Tensor a = torch::randn({16, 16}, torch::requires_grad());
  struct Run {
    int64_t resident_after_forward = 0;  // once the copies out are done
    int64_t disk_after_forward = 0;
    OffloadStats stats;
  };
  auto run = [&](bool enabled) {
    auto offloader = MakeOffloader(Target::kDisk, 0, enabled);
    offloader->BeginStep({a});
    at::Tensor loss;
    {
      OffloadScope scope(offloader.get());
      loss = torch::exp(a * 2).sum();
    }
    offloader->Flush();
    Run r;
    r.resident_after_forward = offloader->resident_saved_bytes();
    r.disk_after_forward = offloader->disk_bytes_held();
    loss.backward();
    r.stats = offloader->EndStep();
    return r;
  };
  const Run disabled = run(false);
  EXPECT_EQ(disabled.resident_after_forward, 16 * 16 * 4);  // exp's result
  EXPECT_EQ(disabled.disk_after_forward, 0);
  EXPECT_EQ(disabled.stats.bytes_out, 0);
  EXPECT_EQ(disabled.stats.skipped_of(SkipReason::kDisabled), 1);
  EXPECT_EQ(disabled.stats.peak_resident_saved_bytes, 16 * 16 * 4);
  EXPECT_EQ(disabled.stats.trl_baseline_bytes_out, 16 * 16 * 4);
  // The same tensor with offloading on leaves the device for the spill file.
  const Run enabled = run(true);
  EXPECT_EQ(enabled.resident_after_forward, 0);
  EXPECT_EQ(enabled.disk_after_forward, 16 * 16 * 4);
  EXPECT_EQ(enabled.stats.tensors_offloaded, 1);
  EXPECT_EQ(enabled.stats.bytes_out, 16 * 16 * 4);
  EXPECT_EQ(enabled.stats.bytes_in, enabled.stats.bytes_out);
  EXPECT_EQ(enabled.stats.trl_baseline_bytes_out, disabled.stats.trl_baseline_bytes_out);
}

// Counts live CPU bytes, on top of the allocator it replaces. The context of
// each DataPtr is its data pointer (raw_allocate requires it).
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr inner = base_->allocate(bytes);
    void* data = inner.get();
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_ += static_cast<int64_t>(bytes);
      blocks_.emplace(data, std::make_pair(std::move(inner), bytes));
    }
    return c10::DataPtr(data, data, &Release, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  int64_t live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
  }
  static CountingAllocator*& Instance() {
    static CountingAllocator* instance = nullptr;
    return instance;
  }

 private:
  static void Release(void* data) {
    CountingAllocator* self = Instance();
    c10::DataPtr inner;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      auto it = self->blocks_.find(data);
      self->live_ -= static_cast<int64_t>(it->second.second);
      inner = std::move(it->second.first);
      self->blocks_.erase(it);
    }
  }
  c10::Allocator* base_;
  mutable std::mutex mu_;
  mutable int64_t live_ = 0;
  mutable std::unordered_map<void*, std::pair<c10::DataPtr, size_t>> blocks_;
};

// A small pre-norm transformer stack: attention and an MLP per block.
struct Block : torch::nn::Module {
  explicit Block(int64_t d)
      : ln1(register_module("ln1",
                            torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        qkv(register_module("qkv", torch::nn::Linear(d, 3 * d))),
        proj(register_module("proj", torch::nn::Linear(d, d))),
        ln2(register_module("ln2",
                            torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc1(register_module("fc1", torch::nn::Linear(d, 4 * d))),
        fc2(register_module("fc2", torch::nn::Linear(4 * d, d))) {}
  at::Tensor forward(at::Tensor x) {
    auto parts = qkv->forward(ln1->forward(x)).chunk(3, -1);
    at::Tensor scores = torch::matmul(parts[0], parts[1].transpose(-2, -1)) / 8.0;
    x = x + proj->forward(torch::matmul(torch::softmax(scores, -1), parts[2]));
    return x + fc2->forward(torch::gelu(fc1->forward(ln2->forward(x))));
  }
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};

TEST(OffloadLifecycleTest, DiskTargetDropsResidentSavedBytesBy70Percent) {
  torch::manual_seed(1);
  std::vector<std::shared_ptr<Block>> blocks;
  std::vector<at::Tensor> params;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(std::make_shared<Block>(64));
    for (const at::Tensor& p : blocks.back()->parameters()) params.push_back(p);
  }
  const at::Tensor input = torch::randn({4, 64, 64});
  if (CountingAllocator::Instance() == nullptr) {
    CountingAllocator::Instance() = new CountingAllocator(c10::GetCPUAllocator());
  }
  CountingAllocator* counting = CountingAllocator::Instance();
  c10::Allocator* previous = c10::GetCPUAllocator();
  c10::SetCPUAllocator(counting, /*priority=*/255);

  struct Measure {
    int64_t accounted = 0;          // offloader's resident bytes at the end of forward
    int64_t allocated = 0;          // allocator's live bytes added by forward
    int64_t after_writes = 0;       // same, once queued writes are done
    int64_t disk_after_writes = 0;  // offloader's spill-file bytes then
    OffloadStats stats;
    std::vector<at::Tensor> grads;
  };
  auto run = [&](bool enabled) {
    auto offloader = MakeOffloader(Target::kDisk, 1024, enabled);
    offloader->BeginStep(params);
    Measure m;
    const int64_t before = counting->live();
    at::Tensor loss;
    {
      OffloadScope scope(offloader.get());
      at::Tensor x = input * 1;
      for (auto& b : blocks) x = b->forward(x);
      loss = x.pow(2).mean();
    }
    m.accounted = offloader->resident_saved_bytes();
    m.allocated = counting->live() - before;
    offloader->Flush();
    m.after_writes = counting->live() - before;
    m.disk_after_writes = offloader->disk_bytes_held();
    loss.backward();
    for (const at::Tensor& p : params) {
      m.grads.push_back(p.grad().clone());
      p.mutable_grad().reset();
    }
    m.stats = offloader->EndStep();
    return m;
  };
  const Measure off = run(false);
  const Measure disk = run(true);
  c10::SetCPUAllocator(previous, /*priority=*/255);

  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(off.grads[i], disk.grads[i])) << "parameter " << i;
  }
  std::cout << "resident saved bytes at end of forward: off " << off.accounted << " disk "
            << disk.accounted << " (allocator: off " << off.allocated << " disk "
            << disk.allocated << ", " << disk.after_writes << " after writes)\n";
  EXPECT_GT(off.accounted, 1 << 20);
  EXPECT_LE(disk.accounted, off.accounted * 3 / 10);
  // The accounting matches what the allocator holds for the graph.
  EXPECT_GE(off.accounted, off.allocated * 9 / 10);
  EXPECT_LE(off.accounted, off.allocated);
  EXPECT_LE(disk.allocated, off.allocated * 3 / 10);
  EXPECT_LE(disk.after_writes, off.allocated / 10);
  // What left memory is in the spill file, and backward read all of it back.
  EXPECT_EQ(off.stats.bytes_out, 0);
  EXPECT_GT(disk.stats.bytes_out, off.accounted / 2);
  EXPECT_EQ(disk.disk_after_writes, disk.stats.bytes_out);
  EXPECT_EQ(disk.stats.bytes_in, disk.stats.bytes_out);
}

}  // namespace
}  // namespace memprofd::offload
