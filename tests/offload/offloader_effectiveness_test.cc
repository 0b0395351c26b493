// Offload effectiveness, in TransformerEngine's style (its test_memory checks
// that device + offloaded ≈ no-offload, to catch "an offloaded tensor [that]
// still has a live pointer"): measured with the counting CPU allocator's live
// bytes at the end of forward, offloading off and on, on the CPU with the disk
// target (the CPU allocator is the "device" here). A storage copied out while
// something else holds it must be reported as ineffective.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <vector>

#include "core/memory/cpu_allocator.h"
#include "core/memory/history.h"
#include "core/memory/recorder.h"
#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/train/checkpoint.h"
#include "offload_test_util.h"

namespace memprofd::offload {
namespace {

using ::memprofd::offload::testing::MakeOffloader;
using ::memprofd::offload::testing::SaveOne;

int64_t LiveCpuBytes() {
  return memory::MemoryRecorder::Global().CurrentBytes(memory::kCpuDevice);
}

// What one forward + backward under `offloader` showed.
struct Measured {
  int64_t live_at_end_of_forward = 0;  // CPU allocator bytes above the baseline
  OffloadStats stats;
};

// y = 2 * a, keeping `a` itself in ctx->saved_data (no saved-tensor hooks):
// what TransformerEngine's docs warn about, a tensor a custom function keeps
// that offloading cannot free.
struct KeepInCtx : public torch::autograd::Function<KeepInCtx> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a) {
    ctx->saved_data["a"] = a;
    return a * 2;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0] * 2};
  }
};

class OffloadEffectivenessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Storages made from here on are counted; the earlier ones are not, and
    // every measure below is a difference.
    ASSERT_TRUE(memory::InstallCountingCpuAllocator().ok());
  }

  // Runs `forward` under `offloader`; reads the live bytes at the end of
  // forward after MarkForwardEnd and after the queued spill-file writes
  // finished (their sources are released then), then runs backward.
  template <typename Forward>
  Measured Run(Offloader* offloader, const std::vector<at::Tensor>& filter,
               Forward forward) {
    Measured m;
    offloader->BeginStep(filter);
    const int64_t before = LiveCpuBytes();
    at::Tensor loss;
    {
      OffloadScope scope(offloader);
      loss = forward();
    }
    offloader->MarkForwardEnd();
    offloader->Flush();
    m.live_at_end_of_forward = LiveCpuBytes() - before;
    loss.backward();
    m.stats = offloader->EndStep();
    return m;
  }
};

TEST_F(OffloadEffectivenessTest,
       TinyLlamaResidentPlusEffectiveMatchesNoOffloadWithin1Percent) {
  auto config = LlamaConfig::Preset("tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  auto model = LlamaModel::Create(*config, /*seed=*/7, c10::Device(c10::kCPU));
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<at::Tensor> filter = (*model)->Parameters();
  for (const at::Tensor& b : (*model)->Buffers()) filter.push_back(b);
  torch::manual_seed(5);
  const at::Tensor ids = torch::randint(0, config->vocab_size, {2, 64}, torch::kLong);
  for (const bool checkpoint : {false, true}) {
    SCOPED_TRACE(checkpoint ? "per-layer checkpointing" : "no checkpointing");
    auto forward = [&] {
      at::Tensor h = (*model)->Embed(ids);
      for (int64_t i = 0; i < (*model)->num_layers(); ++i) {
        h = checkpoint ? CheckpointedLayer(**model, i, h) : (*model)->Layer(i, h);
      }
      h = (*model)->FinalNorm(h);
      NoOffloadScope head;  // as the trainer runs it unless offload_head
      const at::Tensor logits = (*model)->Head(h);
      return torch::nn::functional::cross_entropy(
          logits.reshape({-1, config->vocab_size}), ids.reshape({-1}));
    };
    for (at::Tensor& p : (*model)->Parameters()) p.mutable_grad().reset();
    auto off = MakeOffloader(Target::kDisk, 1024, /*enabled=*/false);
    const Measured kept = Run(off.get(), filter, forward);
    for (at::Tensor& p : (*model)->Parameters()) p.mutable_grad().reset();
    auto disk = MakeOffloader(Target::kDisk, 1024);
    const Measured moved = Run(disk.get(), filter, forward);

    const OffloadStats& s = moved.stats;
    std::cout << "tiny B=2 T=64" << (checkpoint ? " checkpointed" : "")
              << ": live at end of forward: no offload " << kept.live_at_end_of_forward
              << ", offload " << moved.live_at_end_of_forward << "; effective "
              << s.effective_bytes << ", ineffective " << s.ineffective_bytes
              << ", bytes out " << s.bytes_out << "\n";
    EXPECT_EQ(kept.stats.bytes_out, 0);
    EXPECT_EQ(kept.stats.effective_bytes + kept.stats.ineffective_bytes, 0);
    // Most of what forward keeps moved, and freed (checkpointing keeps little).
    if (!checkpoint) {
      EXPECT_GT(s.effective_bytes, kept.live_at_end_of_forward / 2);
    }
    EXPECT_EQ(s.effective_bytes + s.ineffective_bytes, s.bytes_out);
    const int64_t sum = moved.live_at_end_of_forward + s.effective_bytes;
    EXPECT_LE(std::llabs(sum - kept.live_at_end_of_forward),
              kept.live_at_end_of_forward / 100)
        << "resident " << moved.live_at_end_of_forward << " + effective "
        << s.effective_bytes << " vs no-offload resident " << kept.live_at_end_of_forward;
  }
}

TEST_F(OffloadEffectivenessTest, ViewHeldOutsideAutogradMakesItsStorageIneffective) {
  const at::Tensor x = torch::randn({64, 256}, torch::requires_grad());
  const int64_t bytes = 64 * 256 * 4;
  auto forward_with = [&](at::Tensor* held) {
    return [&x, held] {
      const at::Tensor a = x * 2;
      const at::Tensor b = x * 3;
      if (held != nullptr) *held = a.narrow(0, 0, 8);  // a view, kept by the caller
      return SaveOne::apply(a) + SaveOne::apply(b);
    };
  };
  auto free_run = MakeOffloader(Target::kDisk, 0);
  const Measured clean = Run(free_run.get(), {}, forward_with(nullptr));
  EXPECT_EQ(clean.stats.effective_bytes, 2 * bytes);
  EXPECT_EQ(clean.stats.ineffective_bytes, 0);

  at::Tensor held;
  auto held_run = MakeOffloader(Target::kDisk, 0);
  const Measured leaky = Run(held_run.get(), {}, forward_with(&held));
  EXPECT_EQ(leaky.stats.bytes_out, 2 * bytes);
  EXPECT_EQ(leaky.stats.effective_bytes, bytes);
  EXPECT_EQ(leaky.stats.ineffective_bytes, bytes);
  // The allocator agrees: the held storage stayed.
  EXPECT_GE(leaky.live_at_end_of_forward - clean.live_at_end_of_forward, bytes);
  ASSERT_TRUE(held.defined());
}

TEST_F(OffloadEffectivenessTest, TensorKeptByCustomFunctionCtxIsIneffective) {
  const at::Tensor x = torch::randn({64, 256}, torch::requires_grad());
  const int64_t bytes = 64 * 256 * 4;
  auto offloader = MakeOffloader(Target::kDisk, 0);
  const Measured m = Run(offloader.get(), {}, [&x] {
    const at::Tensor a = x * 2;  // saved (offloaded) by SaveOne, kept by KeepInCtx
    const at::Tensor b = x * 3;  // saved by SaveOne only
    return SaveOne::apply(a) + SaveOne::apply(b) + KeepInCtx::apply(a).sum();
  });
  EXPECT_EQ(m.stats.bytes_out, 2 * bytes);
  EXPECT_EQ(m.stats.ineffective_bytes, bytes);
  EXPECT_EQ(m.stats.effective_bytes, bytes);
}

TEST_F(OffloadEffectivenessTest, WithoutMarkForwardEndStoragesAreDecidedAtReload) {
  const at::Tensor x = torch::randn({64, 256}, torch::requires_grad());
  const int64_t bytes = 64 * 256 * 4;
  auto offloader = MakeOffloader(Target::kDisk, 0);
  offloader->BeginStep({});
  at::Tensor held;
  at::Tensor loss;
  {
    OffloadScope scope(offloader.get());
    const at::Tensor a = x * 2;
    held = x * 3;
    loss = SaveOne::apply(a) + SaveOne::apply(held);
  }
  loss.backward();
  const OffloadStats s = offloader->EndStep();
  EXPECT_EQ(s.effective_bytes, bytes);
  EXPECT_EQ(s.ineffective_bytes, bytes);
  EXPECT_EQ(s.effective_bytes + s.ineffective_bytes, s.bytes_out);
}

}  // namespace
}  // namespace memprofd::offload
