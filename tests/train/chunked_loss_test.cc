#include "core/train/chunked_loss.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/common/attribution.h"
#include "core/memory/install.h"
#include "core/memory/op_attribution.h"
#include "core/memory/recorder.h"
#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/train/autocast.h"
#include "core/train/data.h"
#include "core/train/evaluate.h"
#include "core/train/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/offload/offload_test_util.h"
#include "tests/testing/llama.h"

namespace memprofd {
namespace {

using ::testing::HasSubstr;
using testing::MakeLlama;
using testing::SmallLlamaConfig;

// max |a - b| / max |b|: the difference against the tensor's own scale (an
// element near zero has no meaningful relative error of its own).
double RelativeDifference(const at::Tensor& a, const at::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         std::max(scale, 1e-30);
}

// The loss and every distinct parameter's gradient of the model's head and
// loss on `ids` (targets `targets`), with loss_chunk_tokens `chunk`.
struct LossAndGrads {
  at::Tensor loss;
  std::vector<at::Tensor> grads;
};
LossAndGrads HeadLoss(const LlamaModel& m, const at::Tensor& ids,
                      const at::Tensor& targets, int64_t chunk,
                      MixedPrecision precision = MixedPrecision::kNo,
                      offload::Offloader* offloader = nullptr) {
  for (const at::Tensor& p : m.Parameters()) p.mutable_grad() = at::Tensor();
  if (offloader != nullptr) {
    std::vector<at::Tensor> pinned = m.Parameters();
    for (const at::Tensor& b : m.Buffers()) pinned.push_back(b);
    offloader->BeginStep(pinned);
  }
  LossAndGrads out;
  {
    offload::OffloadScope scope(offloader);
    AutocastScope autocast(precision, c10::kCPU);
    out.loss =
        LanguageModelLoss(m, m.ForwardHidden(ids), targets, chunk, LossReduction::kMean);
  }
  out.loss.backward();
  if (offloader != nullptr) offloader->EndStep();
  for (const at::Tensor& p : m.Parameters()) out.grads.push_back(p.grad().clone());
  return out;
}

LlamaConfig Untied(LlamaConfig c) {
  c.tie_word_embeddings = false;
  return c;
}

TEST(ChunkedLossTest, LossAndGradientsEqualTheUnchunkedOnesInFloat32) {
  at::manual_seed(1);
  const at::Tensor ids = torch::randint(0, 256, {2, 24}, torch::kInt64);
  const at::Tensor targets = torch::randint(0, 256, {2, 24}, torch::kInt64);
  double worst_loss = 0, worst_grad = 0;
  for (bool tied : {true, false}) {
    const LlamaConfig config = tied ? SmallLlamaConfig() : Untied(SmallLlamaConfig());
    std::unique_ptr<LlamaModel> m = MakeLlama(config, 3);
    const LossAndGrads plain = HeadLoss(*m, ids, targets, kLossChunkOff);
    // 48 tokens: chunks of 1, 7 (not dividing), 16 (dividing), 48 (one) and
    // 100 (larger than the count), and automatic. One-token chunks run
    // LibTorch's matrix-vector kernels, whose float32 summation order differs
    // most from the whole matmul's (up to 9.6e-7 here): they get 2e-6.
    for (int64_t chunk : {1, 7, 16, 48, 100, 0}) {
      const double tolerance = chunk == 1 ? 2e-6 : 1e-6;
      const LossAndGrads chunked = HeadLoss(*m, ids, targets, chunk);
      SCOPED_TRACE(::testing::Message() << "tied " << tied << " chunk " << chunk);
      EXPECT_EQ(chunked.loss.scalar_type(), at::kFloat);
      worst_loss = std::max(worst_loss, RelativeDifference(chunked.loss, plain.loss));
      EXPECT_LE(RelativeDifference(chunked.loss, plain.loss), tolerance);
      ASSERT_EQ(chunked.grads.size(), plain.grads.size());
      for (size_t i = 0; i < plain.grads.size(); ++i) {
        EXPECT_GT(plain.grads[i].abs().max().item<double>(), 0) << i;
        const double d = RelativeDifference(chunked.grads[i], plain.grads[i]);
        if (chunk != 1) worst_grad = std::max(worst_grad, d);
        EXPECT_LE(d, tolerance) << i;
      }
    }
  }
  RecordProperty("worst_loss_difference", std::to_string(worst_loss));
  RecordProperty("worst_gradient_difference", std::to_string(worst_grad));
  std::printf("largest relative difference: loss %.3g, gradients %.3g (chunks > 1)\n",
              worst_loss, worst_grad);
}

TEST(ChunkedLossTest, HiddenAndWeightGradientsMatchCrossEntropyWithIgnoredTargets) {
  at::manual_seed(2);
  const at::Tensor hidden0 = torch::randn({3, 10, 16});
  const at::Tensor weight0 = torch::randn({50, 16}) * 0.3;
  at::Tensor targets = torch::randint(0, 50, {3, 10}, torch::kInt64);
  targets.index_put_({0, 3}, -100);
  targets.index_put_({2, 9}, -100);
  for (LossReduction reduction : {LossReduction::kMean, LossReduction::kSum}) {
    at::Tensor h1 = hidden0.clone().requires_grad_(true);
    at::Tensor w1 = weight0.clone().requires_grad_(true);
    torch::nn::functional::CrossEntropyFuncOptions options;
    if (reduction == LossReduction::kSum) options.reduction(torch::kSum);
    at::Tensor expected = torch::nn::functional::cross_entropy(
        torch::linear(h1, w1).view({-1, 50}), targets.view({-1}), options);
    expected.backward();
    at::Tensor h2 = hidden0.clone().requires_grad_(true);
    at::Tensor w2 = weight0.clone().requires_grad_(true);
    at::Tensor got = ChunkedHeadCrossEntropy(h2, w2, targets, 4, reduction, 0, 0);
    got.backward();
    EXPECT_LE(RelativeDifference(got, expected), 1e-6);
    EXPECT_LE(RelativeDifference(h2.grad(), h1.grad()), 1e-6);
    EXPECT_LE(RelativeDifference(w2.grad(), w1.grad()), 1e-6);
    // Ignored rows get no gradient.
    EXPECT_EQ(h2.grad().index({0, 3}).abs().max().item<float>(), 0);
  }
}

TEST(ChunkedLossTest, Bf16AutocastMatchesTheUnchunkedAutocastWithinBf16Rounding) {
  at::manual_seed(4);
  const at::Tensor ids = torch::randint(0, 256, {2, 24}, torch::kInt64);
  const at::Tensor targets = torch::randint(0, 256, {2, 24}, torch::kInt64);
  for (bool tied : {true, false}) {
    const LlamaConfig config = tied ? SmallLlamaConfig() : Untied(SmallLlamaConfig());
    std::unique_ptr<LlamaModel> m = MakeLlama(config, 3);
    const LossAndGrads plain =
        HeadLoss(*m, ids, targets, kLossChunkOff, MixedPrecision::kBf16);
    const LossAndGrads f32 = HeadLoss(*m, ids, targets, kLossChunkOff);
    const LossAndGrads chunked = HeadLoss(*m, ids, targets, 7, MixedPrecision::kBf16);
    SCOPED_TRACE(::testing::Message() << "tied " << tied);
    // The head ran in bf16 (it differs from float32), the loss is float32.
    EXPECT_EQ(chunked.loss.scalar_type(), at::kFloat);
    EXPECT_GT(RelativeDifference(chunked.loss, f32.loss), 1e-6);
    EXPECT_LE(RelativeDifference(chunked.loss, plain.loss), 4e-3);
    double worst_grad = 0;
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      EXPECT_EQ(chunked.grads[i].scalar_type(), at::kFloat);
      const double d = RelativeDifference(chunked.grads[i], plain.grads[i]);
      worst_grad = std::max(worst_grad, d);
      EXPECT_LE(d, 2e-2) << i;
    }
    std::printf("bf16, tied %d: relative difference loss %.3g, gradients at most %.3g\n",
                tied, RelativeDifference(chunked.loss, plain.loss), worst_grad);
  }
}

TEST(ChunkedLossTest, OffloadingTheSavedHiddenStatesChangesNoBit) {
  at::manual_seed(5);
  const at::Tensor ids = torch::randint(0, 256, {2, 24}, torch::kInt64);
  const at::Tensor targets = torch::randint(0, 256, {2, 24}, torch::kInt64);
  for (bool tied : {true, false}) {
    const LlamaConfig config = tied ? SmallLlamaConfig() : Untied(SmallLlamaConfig());
    std::unique_ptr<LlamaModel> m = MakeLlama(config, 3);
    const LossAndGrads off = HeadLoss(*m, ids, targets, 7);
    std::unique_ptr<offload::Offloader> offloader =
        offload::testing::MakeOffloader(offload::Target::kDisk, 0);
    ASSERT_NE(offloader, nullptr);
    const LossAndGrads on =
        HeadLoss(*m, ids, targets, 7, MixedPrecision::kNo, offloader.get());
    const offload::OffloadStats totals = offloader->Totals();
    // The chunked node's saved hidden states moved; its weight did not.
    EXPECT_GT(totals.tensors_offloaded, 0);
    EXPECT_GT(totals.skipped_of(offload::SkipReason::kParameter), 0);
    EXPECT_TRUE(torch::equal(on.loss, off.loss));
    for (size_t i = 0; i < off.grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(on.grads[i], off.grads[i])) << "tied " << tied << " " << i;
    }
  }
}

TEST(ChunkedLossTest, TheHeadWeightIsSavedAsTheParameterItselfNotACopy) {
  std::unique_ptr<LlamaModel> m = MakeLlama(Untied(SmallLlamaConfig()), 3);
  const at::Tensor ids = torch::randint(0, 256, {2, 8}, torch::kInt64);
  std::unique_ptr<offload::Offloader> offloader =
      offload::testing::MakeOffloader(offload::Target::kDisk, 0);
  std::vector<at::Tensor> pinned = m->Parameters();
  offloader->BeginStep(pinned);
  // Outside the scope: only the chunked node saves inside it.
  at::Tensor hidden = m->ForwardHidden(ids);
  at::Tensor loss;
  {
    offload::OffloadScope scope(offloader.get());
    loss = LanguageModelLoss(*m, hidden, ids, 5, LossReduction::kMean);
  }
  EXPECT_THAT(loss.grad_fn()->name(), HasSubstr("ChunkedCrossEntropyFunction"));
  loss.backward();
  const offload::OffloadStats stats = offloader->EndStep();
  // hidden, weight, targets, logsumexp: the weight is the parameter.
  EXPECT_EQ(stats.tensors_seen, 4);
  EXPECT_EQ(stats.skipped_of(offload::SkipReason::kParameter), 1);
  EXPECT_EQ(stats.tensors_offloaded, 3);
  EXPECT_TRUE(m->Parameters().back().grad().defined());
}

TEST(ChunkedLossTest, ATrainerStepWithChunksHasTheLossOfOneWithout) {
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
    o.loss_chunk_tokens = chunked ? 24 : kLossChunkOff;
    absl::StatusOr<TrainResult> r = trainer.Run(o, [&](const StepReport& s) {
      losses[chunked].push_back(s.loss);
      norms[chunked].push_back(s.grad_norm);
    });
    ASSERT_TRUE(r.ok()) << r.status();
  }
  ASSERT_EQ(losses[0].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(losses[1][i], losses[0][i], 1e-6 * losses[0][i]) << i;
    EXPECT_NEAR(norms[1][i], norms[0][i], 1e-5 * norms[0][i]) << i;
  }
}

TEST(ChunkedLossTest, EvaluationWithChunksHasTheLossOfOneWithout) {
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

TEST(ChunkedLossTest, AStepsPeakIsLowerWithChunksAndTheChunksAreAttributedToTheHead) {
  ASSERT_TRUE(memory::InstallMemoryAccounting().ok());
  memory::OpAttribution ops;
  memory::MemoryRecorder& recorder = memory::MemoryRecorder::Global();
  const ModuleId head = InternModule("lm_head");
  const ModuleId loss = InternModule("loss");
  const OpId chunk_op = InternOp("memprofd::chunked_cross_entropy");
  int64_t peak[2] = {0, 0};
  int64_t head_forward_peak[2] = {0, 0};
  for (int chunked : {0, 1}) {
    std::unique_ptr<LlamaModel> m = MakeLlama(LargeVocabConfig(), 5);
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
    ASSERT_TRUE(trainer.Run(o).ok());
    recorder.ResetPeak();
    const int64_t before = recorder.CurrentBytes(memory::kCpuDevice);
    ASSERT_TRUE(trainer.Run(o).ok());
    peak[chunked] = recorder.PeakBytes(memory::kCpuDevice) - before;
    const std::vector<memory::StepAttribution> steps = recorder.StepRecords();
    ASSERT_FALSE(steps.empty());
    bool loss_seen = false;
    for (const memory::CellPhasePeak& c : steps.back().phase_peaks) {
      if (c.phase == Phase::kForward && c.module == head &&
          c.category == Category::kTemporaries) {
        head_forward_peak[chunked] = c.peak_bytes;
      }
      loss_seen = loss_seen || (c.module == loss && c.peak_bytes > 0);
    }
    EXPECT_TRUE(loss_seen) << chunked;
    if (chunked) {
      int64_t op_bytes = 0;
      for (const memory::OpBytes& b : steps.back().op_bytes) {
        if (b.op == chunk_op) op_bytes += b.bytes;
      }
      EXPECT_GE(op_bytes, 256 / 32 * 32 * 16384 * 4);  // every chunk's logits
    }
  }
  const int64_t logits_bytes = int64_t{256} * 16384 * 4;
  // Unchunked, the step holds the logits and their log-softmax at least.
  EXPECT_GE(peak[0], 2 * logits_bytes);
  EXPECT_LT(peak[1] * 2, peak[0]) << peak[1] << " vs " << peak[0];
  // The head's temporaries in forward: the whole logits vs a chunk's (one
  // chunk, 2 MiB, or two when the next is made before the last is freed).
  EXPECT_GE(head_forward_peak[0], logits_bytes);
  EXPECT_GT(head_forward_peak[1], 0);
  EXPECT_LE(head_forward_peak[1], 2 * 32 * 16384 * 4 + (int64_t{1} << 20));
}

TEST(ChunkedLossTest, TheAutomaticChunkFollowsTheVocabularyAndHiddenSize) {
  // Rows <= hidden, bounded by 256 MiB of float32 logits, at least 256.
  EXPECT_EQ(AutomaticLossChunkTokens(128256, 256), 256);
  EXPECT_EQ(AutomaticLossChunkTokens(128256, 2048), 523);
  EXPECT_EQ(AutomaticLossChunkTokens(151936, 896), 441);
  EXPECT_EQ(AutomaticLossChunkTokens(256, 32), 256);
  EXPECT_EQ(AutomaticLossChunkTokens(49152, 576), 576);
  EXPECT_EQ(ResolveLossChunkTokens(kLossChunkOff, 128256, 256), 0);
  EXPECT_EQ(ResolveLossChunkTokens(kLossChunkAutomatic, 128256, 256), 256);
  EXPECT_EQ(ResolveLossChunkTokens(77, 128256, 256), 77);
}

TEST(ChunkedLossTest, BadChunkSizesAreInvalidArgumentSayingWhatTheValuesMean) {
  for (int64_t bad : {int64_t{-2}, int64_t{-100}, kMaxLossChunkTokens + 1}) {
    TrainOptions o;
    o.loss_chunk_tokens = bad;
    absl::Status s = ValidateTrainOptions(o, 2048);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("loss_chunk_tokens"));
    EXPECT_THAT(s.message(), HasSubstr("-1 (off"));
    EvalOptions e;
    e.loss_chunk_tokens = bad;
    EXPECT_TRUE(absl::IsInvalidArgument(ValidateEvalOptions(e, 2048)));
    TrainOverrides r;
    r.steps = 1;
    r.loss_chunk_tokens = bad;
    EXPECT_TRUE(
        absl::IsInvalidArgument(MergeTrainOverrides(TrainOptions{}, r, 2048).status()));
  }
  for (int64_t good :
       {kLossChunkOff, kLossChunkAutomatic, int64_t{1}, kMaxLossChunkTokens}) {
    TrainOptions o;
    o.loss_chunk_tokens = good;
    EXPECT_TRUE(ValidateTrainOptions(o, 2048).ok()) << good;
  }
}

}  // namespace
}  // namespace memprofd
