// The fused linear cross-entropy's memory (core/train/chunked_loss.h): what
// it saves for backward and what the offloader does with it, the weight's
// gradient made in forward and adopted as .grad without a copy, the step's
// peak against the unchunked loss's, evaluation without gradients, and
// trainer steps and evaluations with and without chunks.

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/common/attribution.h"
#include "core/memory/install.h"
#include "core/memory/op_attribution.h"
#include "core/memory/recorder.h"
#include "core/memory/tagging.h"
#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/train/chunked_loss.h"
#include "core/train/data.h"
#include "core/train/evaluate.h"
#include "core/train/memory_tags.h"
#include "core/train/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/offload/offload_test_util.h"
#include "tests/testing/llama.h"
#include "tests/testing/train.h"

namespace memprofd {
namespace {

using testing::CheckAndRun;
using testing::Request;

using ::testing::HasSubstr;
using testing::MakeLlama;
using testing::SmallLlamaConfig;

LlamaConfig Untied(LlamaConfig c) {
  c.tie_word_embeddings = false;
  return c;
}

// The loss (chunks of 7) and every parameter's gradient, the forward inside
// `offloader`'s scope when one is given.
struct LossAndGrads {
  at::Tensor loss;
  std::vector<at::Tensor> grads;
};
LossAndGrads HeadLoss(const LlamaModel& m, const at::Tensor& ids,
                      const at::Tensor& targets, offload::Offloader* offloader) {
  for (const at::Tensor& p : m.Parameters()) p.mutable_grad() = at::Tensor();
  if (offloader != nullptr) {
    std::vector<at::Tensor> pinned = m.Parameters();
    for (const at::Tensor& b : m.Buffers()) pinned.push_back(b);
    offloader->BeginStep(pinned);
  }
  LossAndGrads out;
  {
    offload::OffloadScope scope(offloader);
    out.loss =
        LanguageModelLoss(m, m.ForwardHidden(ids), targets, 7, LossReduction::kMean);
  }
  out.loss.backward();
  if (offloader != nullptr) offloader->EndStep();
  for (const at::Tensor& p : m.Parameters()) out.grads.push_back(p.grad().clone());
  return out;
}

TEST(ChunkedLossMemoryTest, OffloadingTheSavedHiddenStatesGradientChangesNoBit) {
  at::manual_seed(5);
  const at::Tensor ids = torch::randint(0, 256, {2, 24}, torch::kInt64);
  const at::Tensor targets = torch::randint(0, 256, {2, 24}, torch::kInt64);
  for (bool tied : {true, false}) {
    const LlamaConfig config = tied ? SmallLlamaConfig() : Untied(SmallLlamaConfig());
    std::unique_ptr<LlamaModel> m = MakeLlama(config, 3);
    const LossAndGrads off = HeadLoss(*m, ids, targets, nullptr);
    std::unique_ptr<offload::Offloader> offloader =
        offload::testing::MakeOffloader(offload::Target::kDisk, 0);
    ASSERT_NE(offloader, nullptr);
    const LossAndGrads on = HeadLoss(*m, ids, targets, offloader.get());
    EXPECT_GT(offloader->Totals().tensors_offloaded, 0);
    EXPECT_TRUE(torch::equal(on.loss, off.loss));
    for (size_t i = 0; i < off.grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(on.grads[i], off.grads[i])) << "tied " << tied << " " << i;
    }
  }
}

TEST(ChunkedLossMemoryTest, BackwardNeedsOnlyTheHiddenStatesGradient) {
  std::unique_ptr<LlamaModel> m = MakeLlama(Untied(SmallLlamaConfig()), 3);
  const at::Tensor ids = torch::randint(0, 256, {2, 8}, torch::kInt64);
  std::unique_ptr<offload::Offloader> offloader =
      offload::testing::MakeOffloader(offload::Target::kDisk, 0);
  std::vector<at::Tensor> pinned = m->Parameters();
  offloader->BeginStep(pinned);
  // Outside the scope: only the fused node saves inside it.
  at::Tensor hidden = m->ForwardHidden(ids);
  at::Tensor loss;
  {
    offload::OffloadScope scope(offloader.get());
    loss = LanguageModelLoss(*m, hidden, ids, 5, LossReduction::kMean);
  }
  EXPECT_THAT(loss.grad_fn()->name(), HasSubstr("FusedLinearCrossEntropy"));
  loss.backward();
  const offload::OffloadStats stats = offloader->EndStep();
  // Not the hidden states, the weight, the targets: their gradient only.
  EXPECT_EQ(stats.tensors_seen, 1);
  EXPECT_EQ(stats.tensors_offloaded, 1);
  EXPECT_EQ(stats.skipped_of(offload::SkipReason::kParameter), 0);
  EXPECT_TRUE(m->Parameters().back().grad().defined());
}

// The weight's gradient exists once forward ends, as a gradient; backward
// allocates no second one (AccumulateGrad adopts it) and hands it to the
// weight.
TEST(ChunkedLossMemoryTest, TheWeightsGradientIsMadeInForwardAndAdoptedWithoutACopy) {
  ASSERT_TRUE(memory::InstallMemoryAccounting().ok());
  memory::MemoryRecorder& recorder = memory::MemoryRecorder::Global();
  at::manual_seed(9);
  constexpr int64_t kVocab = 4096, kHidden = 64;
  constexpr int64_t kWeightBytes = kVocab * kHidden * 4;
  at::Tensor w = (torch::randn({kVocab, kHidden}) * 0.1).requires_grad_(true);
  at::Tensor h = torch::randn({2, 16, kHidden}).requires_grad_(true);
  const at::Tensor targets = torch::randint(0, kVocab, {2, 16}, torch::kInt64);
  const ModuleId head = InternModule("lm_head");
  memory::TagStorage(w, head, Category::kParameters);
  const int64_t before = recorder.CurrentBytes(memory::kCpuDevice);
  at::Tensor loss = ChunkedHeadCrossEntropy(h, w, targets, 8, LossReduction::kMean, head,
                                            InternModule("loss"));
  EXPECT_GE(recorder.CurrentBytes(memory::kCpuDevice) - before, kWeightBytes);
  recorder.ResetPeak();
  const int64_t start = recorder.CurrentBytes(memory::kCpuDevice);
  loss.backward();
  EXPECT_LT(recorder.PeakBytes(memory::kCpuDevice) - start, kWeightBytes / 4);
  ASSERT_TRUE(w.grad().defined());
  const std::optional<Attribution> grad = memory::StorageAttribution(w.grad());
  ASSERT_TRUE(grad.has_value());
  EXPECT_EQ(grad->category, Category::kGradients);
  EXPECT_EQ(grad->module, head);
}

// Without gradients (evaluation) nothing of them is computed: the peak is
// the chunk's logits, not the weight's gradient on top, and there is no node.
TEST(ChunkedLossMemoryTest, WithoutGradientsOnlyTheLossIsComputed) {
  ASSERT_TRUE(memory::InstallMemoryAccounting().ok());
  memory::MemoryRecorder& recorder = memory::MemoryRecorder::Global();
  at::manual_seed(10);
  constexpr int64_t kVocab = 16384, kHidden = 32, kChunk = 32;
  constexpr int64_t kChunkBytes = kChunk * kVocab * 4;
  at::Tensor w = (torch::randn({kVocab, kHidden}) * 0.1).requires_grad_(true);
  at::Tensor h = torch::randn({4, 64, kHidden}).requires_grad_(true);
  const at::Tensor targets = torch::randint(0, kVocab, {4, 64}, torch::kInt64);
  int64_t peaks[2] = {0, 0};
  at::Tensor losses[2];
  for (int grad : {0, 1}) {
    std::optional<torch::NoGradGuard> no_grad;
    if (grad == 0) no_grad.emplace();
    recorder.ResetPeak();
    const int64_t start = recorder.CurrentBytes(memory::kCpuDevice);
    losses[grad] =
        ChunkedHeadCrossEntropy(h, w, targets, kChunk, LossReduction::kSum, 0, 0);
    peaks[grad] = recorder.PeakBytes(memory::kCpuDevice) - start;
    EXPECT_EQ(losses[grad].grad_fn() != nullptr, grad == 1);
  }
  EXPECT_TRUE(torch::equal(losses[0], losses[1].detach()));
  EXPECT_GE(peaks[0], kChunkBytes);
  EXPECT_LT(peaks[0], kChunkBytes + (int64_t{256} << 10)) << peaks[0];
  EXPECT_GE(peaks[1], kChunkBytes + kVocab * kHidden * 4) << peaks[1];
}

TEST(ChunkedLossMemoryTest, TrainerStepsWithChunksHaveTheLossOfStepsWithout) {
  // Plain, two accumulated micro-batches, and those with checkpointing.
  for (const int64_t accumulation : {1, 2}) {
    for (const bool checkpointing : {false, true}) {
      std::vector<double> losses[2];
      std::vector<double> norms[2];
      for (int chunked : {0, 1}) {
        std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
        Trainer trainer(m.get());
        TrainOptions o;
        o.steps = 3;
        o.batch_size = 4;
        o.seq_len = 32;
        o.seed = 9;
        o.grad_accumulation_steps = accumulation;
        o.gradient_checkpointing = checkpointing;
        o.loss_chunk_tokens = chunked ? 24 : kLossChunkOff;
        absl::StatusOr<TrainResult> r =
            CheckAndRun(trainer, o, Request([&](const StepReport& s) {
                          losses[chunked].push_back(s.loss);
                          norms[chunked].push_back(s.grad_norm);
                        }));
        ASSERT_TRUE(r.ok()) << r.status();
      }
      ASSERT_EQ(losses[0].size(), 3u);
      for (size_t i = 0; i < 3; ++i) {
        SCOPED_TRACE(::testing::Message()
                     << "accumulation " << accumulation << ", checkpointing "
                     << checkpointing << ", step " << i);
        EXPECT_NEAR(losses[1][i], losses[0][i], 1e-6 * losses[0][i]);
        EXPECT_NEAR(norms[1][i], norms[0][i], 1e-5 * norms[0][i]);
      }
    }
  }
}

TEST(ChunkedLossMemoryTest, EvaluationWithChunksHasTheLossOfOneWithout) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  absl::StatusOr<std::unique_ptr<TokenDataset>> data =
      TokenDataset::Create(DataSpec{}, m->config().vocab_size);
  ASSERT_TRUE(data.ok()) << data.status();
  EvalOptions o;
  o.batch_size = 4;
  o.seq_len = 32;
  o.max_batches = 2;
  o.loss_chunk_tokens = kLossChunkOff;
  absl::StatusOr<EvalResult> plain = EvaluateModel(*m, **data, o);
  o.loss_chunk_tokens = 10;
  absl::StatusOr<EvalResult> chunked = EvaluateModel(*m, **data, o);
  ASSERT_TRUE(plain.ok() && chunked.ok());
  EXPECT_NEAR(chunked->loss, plain->loss, 1e-6 * plain->loss);
  EXPECT_EQ(chunked->tokens, plain->tokens);
}

// A vocabulary of 16,384 over a hidden size of 32: the head dominates, as in
// a real 1B model at 128k ids. 256 tokens' logits are 16 MiB in float32.
LlamaConfig LargeVocabConfig() {
  LlamaConfig c = Untied(SmallLlamaConfig());
  c.vocab_size = 16384;
  c.num_hidden_layers = 1;
  return c;
}

TEST(ChunkedLossMemoryTest,
     AStepsPeakIsLowerWithChunksAndTheChunksAreAttributedToTheHead) {
  ASSERT_TRUE(memory::InstallMemoryAccounting().ok());
  memory::OpAttribution ops;
  memory::MemoryRecorder& recorder = memory::MemoryRecorder::Global();
  const ModuleId head = InternModule("lm_head");
  const ModuleId loss = InternModule("loss");
  const ModuleId head_weight = InternModule("lm_head.weight");  // the parameter's name
  const OpId fused_op = InternOp("memprofd::fused_linear_cross_entropy");
  constexpr int64_t kChunkBytes = 32 * 16384 * 4;
  int64_t peak[2] = {0, 0};
  int64_t head_forward_peak[2] = {0, 0};
  int64_t head_gradient_forward_peak = 0;
  for (int chunked : {0, 1}) {
    std::unique_ptr<LlamaModel> m = MakeLlama(LargeVocabConfig(), 5);
    TagModelMemory(*m);  // as a loaded model's: parameters and gradients named
    Trainer trainer(m.get());
    TrainOptions o;
    o.steps = 1;
    o.batch_size = 4;
    o.seq_len = 64;
    o.loss_chunk_tokens = chunked ? 32 : kLossChunkOff;
    std::vector<int64_t> tokens(4096);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 7919) % 16384;
    o.data.kind = DataSpec::Kind::kInlineTokens;
    o.data.tokens = tokens;
    // One step first, so that AdamW's state exists in both measured steps.
    ASSERT_TRUE(CheckAndRun(trainer, o).ok());
    recorder.ResetPeak();
    const int64_t before = recorder.CurrentBytes(memory::kCpuDevice);
    ASSERT_TRUE(CheckAndRun(trainer, o).ok());
    peak[chunked] = recorder.PeakBytes(memory::kCpuDevice) - before;
    const std::vector<memory::StepAttribution> steps = recorder.StepRecords();
    ASSERT_FALSE(steps.empty());
    bool loss_seen = false;
    for (const memory::CellPhasePeak& c : steps.back().phase_peaks) {
      if (c.phase == Phase::kForward && c.module == head &&
          c.category == Category::kTemporaries) {
        head_forward_peak[chunked] = c.peak_bytes;
      }
      if (chunked && c.phase == Phase::kForward && c.module == head_weight &&
          c.category == Category::kGradients) {
        head_gradient_forward_peak = c.peak_bytes;
      }
      loss_seen = loss_seen || (c.module == loss && c.peak_bytes > 0);
    }
    EXPECT_TRUE(loss_seen) << chunked;
    if (chunked) {
      int64_t op_bytes = 0;
      for (const memory::OpBytes& b : steps.back().op_bytes) {
        if (b.op == fused_op) op_bytes += b.bytes;
      }
      // The chunk's logits buffer, once for all chunks, and the weight's
      // gradient.
      EXPECT_GE(op_bytes, kChunkBytes + 16384 * 32 * 4);
      EXPECT_LT(op_bytes, 2 * kChunkBytes + 16384 * 32 * 4 + (int64_t{1} << 20));
    }
  }
  const int64_t logits_bytes = int64_t{256} * 16384 * 4;
  // Unchunked, the step holds the logits and their log-softmax at least.
  EXPECT_GE(peak[0], 2 * logits_bytes);
  EXPECT_LT(peak[1] * 2, peak[0]) << peak[1] << " vs " << peak[0];
  // The head's temporaries in forward: the whole logits vs one chunk's
  // buffer; the head weight's gradient, made in forward, as a gradient.
  EXPECT_GE(head_forward_peak[0], logits_bytes);
  EXPECT_GE(head_forward_peak[1], kChunkBytes);
  EXPECT_LE(head_forward_peak[1], kChunkBytes + (int64_t{1} << 20));
  EXPECT_EQ(head_gradient_forward_peak, 16384 * 32 * 4);
}

}  // namespace
}  // namespace memprofd
