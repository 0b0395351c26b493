// The fused linear cross-entropy (core/train/chunked_loss.h) against the
// unchunked head and loss: the loss and every gradient of every model family,
// float32 and bf16, tied and untied heads, ignored targets, gradient
// accumulation and checkpointing. Its memory, offloading and evaluation are
// in chunked_loss_memory_test.cc.

#include "core/train/chunked_loss.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/model/llama.h"
#include "core/train/autocast.h"
#include "core/train/checkpoint.h"
#include "core/train/eval_options.h"
#include "core/train/train_options.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

LlamaConfig Untied(LlamaConfig c) {
  c.tie_word_embeddings = false;
  return c;
}

// The small config in the shape of each family the daemon implements: Llama
// tied and untied, Mistral with a sliding window, Qwen2 with its q/k/v biases
// and a sliding window on its second layer, Qwen3 with q/k norms and all four
// attention biases (untied, as the families ship).
struct Family {
  std::string name;
  LlamaConfig config;
};
std::vector<Family> Families() {
  std::vector<Family> out = {{"llama tied", SmallLlamaConfig()},
                             {"llama untied", Untied(SmallLlamaConfig())}};
  LlamaConfig mistral = Untied(SmallLlamaConfig());
  mistral.architecture = "MistralForCausalLM";
  mistral.model_type = "mistral";
  mistral.sliding_window = 8;
  out.push_back({"mistral", mistral});
  out.push_back({"qwen2", testing::AsWindowedQwen2(Untied(SmallLlamaConfig()))});
  LlamaConfig qwen3 = testing::AsQwen3(SmallLlamaConfig());
  qwen3.explicit_head_dim = 8;
  out.push_back({"qwen3", qwen3});
  return out;
}

// How a loss is computed and backpropagated: loss_chunk_tokens `chunk`,
// under `precision`, every layer checkpointed or not, and over
// `micro_batches` equal slices of the batch, each loss divided by their
// count, as the trainer accumulates.
struct LossRun {
  int64_t chunk = kLossChunkOff;
  MixedPrecision precision = MixedPrecision::kNo;
  bool checkpoint = false;
  int64_t micro_batches = 1;
};

// The loss (summed over the micro-batches) and every parameter's gradient.
struct LossAndGrads {
  at::Tensor loss;
  std::vector<at::Tensor> grads;
};
LossAndGrads HeadLoss(const LlamaModel& m, const at::Tensor& ids,
                      const at::Tensor& targets, const LossRun& run) {
  for (const at::Tensor& p : m.Parameters()) p.mutable_grad() = at::Tensor();
  LossAndGrads out;
  out.loss = torch::zeros({});
  const int64_t rows = ids.size(0) / run.micro_batches;
  for (int64_t k = 0; k < run.micro_batches; ++k) {
    at::Tensor loss;
    {
      AutocastScope autocast(run.precision, c10::kCPU);
      at::Tensor hidden = m.Embed(ids.narrow(0, k * rows, rows));
      for (int64_t i = 0; i < m.num_layers(); ++i) {
        hidden = run.checkpoint ? CheckpointedLayer(m, i, hidden) : m.Layer(i, hidden);
      }
      loss = LanguageModelLoss(m, m.FinalNorm(hidden), targets.narrow(0, k * rows, rows),
                               run.chunk, LossReduction::kMean);
      if (run.micro_batches > 1) loss = loss / static_cast<double>(run.micro_batches);
    }
    loss.backward();
    out.loss = out.loss + loss.detach();
  }
  for (const at::Tensor& p : m.Parameters()) out.grads.push_back(p.grad().clone());
  return out;
}

// Random ids and targets [4, 12], a few targets ignored (-100), as a
// padded batch's labels are.
void Batch(uint64_t seed, at::Tensor* ids, at::Tensor* targets) {
  at::manual_seed(seed);
  *ids = torch::randint(0, 256, {4, 12}, torch::kInt64);
  *targets = torch::randint(0, 256, {4, 12}, torch::kInt64);
  for (int64_t row : {0, 1, 3}) targets->index_put_({row, 11 - row}, -100);
  targets->index_put_({2, 0}, -100);
}

// Loss and gradients within `tolerance` of `reference` (relative to each
// tensor's own largest value); each gradient non-zero.
void ExpectClose(const LossAndGrads& got, const LossAndGrads& reference, double tolerance,
                 double* worst_loss = nullptr, double* worst_grad = nullptr) {
  EXPECT_EQ(got.loss.scalar_type(), at::kFloat);
  const double dl = RelativeDifference(got.loss, reference.loss);
  EXPECT_LE(dl, tolerance);
  if (worst_loss != nullptr) *worst_loss = std::max(*worst_loss, dl);
  ASSERT_EQ(got.grads.size(), reference.grads.size());
  for (size_t i = 0; i < reference.grads.size(); ++i) {
    EXPECT_GT(reference.grads[i].abs().max().item<double>(), 0) << i;
    EXPECT_EQ(got.grads[i].scalar_type(), reference.grads[i].scalar_type()) << i;
    const double d = RelativeDifference(got.grads[i], reference.grads[i]);
    if (worst_grad != nullptr) *worst_grad = std::max(*worst_grad, d);
    EXPECT_LE(d, tolerance) << "parameter " << i;
  }
}

TEST(ChunkedLossTest, LossAndGradientsEqualTheUnchunkedOnesInFloat32ForEveryFamily) {
  at::Tensor ids, targets;
  Batch(1, &ids, &targets);
  double worst_loss = 0, worst_grad = 0;
  for (const Family& family : Families()) {
    std::unique_ptr<LlamaModel> m = MakeLlama(family.config, 3);
    ASSERT_NE(m, nullptr) << family.name;
    const LossAndGrads plain = HeadLoss(*m, ids, targets, {});
    // 48 tokens: chunks of 1, 7 (not dividing), 16 (dividing), 48 (one) and
    // 100 (larger than the count), and automatic. One-token chunks run
    // LibTorch's matrix-vector kernels, whose float32 summation order differs
    // most from the whole matmul's: they get 2e-6.
    for (int64_t chunk : {1, 7, 16, 48, 100, 0}) {
      SCOPED_TRACE(::testing::Message() << family.name << ", chunk " << chunk);
      LossRun run;
      run.chunk = chunk;
      ExpectClose(HeadLoss(*m, ids, targets, run), plain, chunk == 1 ? 2e-6 : 1e-6,
                  &worst_loss, chunk == 1 ? nullptr : &worst_grad);
    }
  }
  RecordProperty("worst_loss_difference", std::to_string(worst_loss));
  RecordProperty("worst_gradient_difference", std::to_string(worst_grad));
  std::printf("largest relative difference: loss %.3g, gradients %.3g (chunks > 1)\n",
              worst_loss, worst_grad);
}

// Checkpointed layers and two accumulated micro-batches, each against the
// unchunked loss run the same way.
TEST(ChunkedLossTest, CheckpointingAndAccumulationKeepTheUnchunkedGradients) {
  at::Tensor ids, targets;
  Batch(6, &ids, &targets);
  for (bool tied : {true, false}) {
    const LlamaConfig config = tied ? SmallLlamaConfig() : Untied(SmallLlamaConfig());
    std::unique_ptr<LlamaModel> m = MakeLlama(config, 7);
    for (bool checkpoint : {false, true}) {
      for (int64_t micro_batches : {1, 2}) {
        SCOPED_TRACE(::testing::Message()
                     << "tied " << tied << ", checkpointing " << checkpoint
                     << ", micro-batches " << micro_batches);
        LossRun run;
        run.checkpoint = checkpoint;
        run.micro_batches = micro_batches;
        const LossAndGrads plain = HeadLoss(*m, ids, targets, run);
        run.chunk = 7;
        ExpectClose(HeadLoss(*m, ids, targets, run), plain, 1e-6);
      }
    }
  }
}

TEST(ChunkedLossTest, HiddenAndWeightGradientsMatchCrossEntropyWithIgnoredTargets) {
  at::manual_seed(2);
  const at::Tensor hidden0 = torch::randn({3, 10, 16});
  const at::Tensor weight0 = torch::randn({50, 16}) * 0.3;
  at::Tensor targets = torch::randint(0, 50, {3, 10}, torch::kInt64);
  targets.index_put_({0, 3}, -100);
  targets.index_put_({2, 9}, -100);
  for (LossReduction reduction : {LossReduction::kMean, LossReduction::kSum}) {
    for (const bool hidden_grad : {true, false}) {
      at::Tensor h1 = hidden0.clone().requires_grad_(true);
      at::Tensor w1 = weight0.clone().requires_grad_(true);
      torch::nn::functional::CrossEntropyFuncOptions options;
      if (reduction == LossReduction::kSum) options.reduction(torch::kSum);
      at::Tensor expected = torch::nn::functional::cross_entropy(
          torch::linear(h1, w1).view({-1, 50}), targets.view({-1}), options);
      expected.backward();
      // A frozen input (here the hidden states) gets no gradient and costs
      // none.
      at::Tensor h2 = hidden0.clone().requires_grad_(hidden_grad);
      at::Tensor w2 = weight0.clone().requires_grad_(true);
      at::Tensor got = ChunkedHeadCrossEntropy(h2, w2, targets, 4, reduction, 0, 0);
      got.backward();
      EXPECT_LE(RelativeDifference(got, expected), 1e-6);
      EXPECT_LE(RelativeDifference(w2.grad(), w1.grad()), 1e-6);
      if (!hidden_grad) {
        EXPECT_FALSE(h2.grad().defined());
        continue;
      }
      EXPECT_LE(RelativeDifference(h2.grad(), h1.grad()), 1e-6);
      // Ignored rows get no gradient.
      EXPECT_EQ(h2.grad().index({0, 3}).abs().max().item<float>(), 0);
      EXPECT_EQ(h2.grad().index({2, 9}).abs().max().item<float>(), 0);
    }
  }
}

// Under bf16 autocast the head's matmuls run in bf16 and the loss in
// float32, as in autocast's unchunked linear and loss; the fused loss rounds
// each chunk's share of the weight's gradient to bf16 before summing them in
// float32, where the unchunked matmul rounds the whole sum once. The stated
// tolerances: the loss within 1e-6 (the same bf16 logits, a float32 loss),
// every gradient within 1e-2, bf16's (8 bits of mantissa, 3.9e-3 per
// rounding; 4.0e-3 measured).
TEST(ChunkedLossTest, Bf16AutocastMatchesTheUnchunkedAutocastWithinBf16Rounding) {
  at::Tensor ids, targets;
  Batch(4, &ids, &targets);
  for (bool tied : {true, false}) {
    for (bool checkpoint : {false, true}) {
      const LlamaConfig config = tied ? SmallLlamaConfig() : Untied(SmallLlamaConfig());
      std::unique_ptr<LlamaModel> m = MakeLlama(config, 3);
      LossRun run;
      run.precision = MixedPrecision::kBf16;
      run.checkpoint = checkpoint;
      const LossAndGrads plain = HeadLoss(*m, ids, targets, run);
      const LossAndGrads f32 = HeadLoss(*m, ids, targets, {});
      run.chunk = 7;
      const LossAndGrads chunked = HeadLoss(*m, ids, targets, run);
      SCOPED_TRACE(::testing::Message()
                   << "tied " << tied << ", checkpointing " << checkpoint);
      // The head ran in bf16 (it differs from float32), the loss is float32.
      EXPECT_EQ(chunked.loss.scalar_type(), at::kFloat);
      EXPECT_GT(RelativeDifference(chunked.loss, f32.loss), 1e-6);
      EXPECT_LE(RelativeDifference(chunked.loss, plain.loss), 1e-6);
      double worst_grad = 0;
      for (size_t i = 0; i < plain.grads.size(); ++i) {
        EXPECT_EQ(chunked.grads[i].scalar_type(), at::kFloat);
        const double d = RelativeDifference(chunked.grads[i], plain.grads[i]);
        worst_grad = std::max(worst_grad, d);
        EXPECT_LE(d, 1e-2) << i;
      }
      std::printf(
          "bf16, tied %d, checkpointing %d: relative difference loss %.3g, gradients at "
          "most %.3g\n",
          tied, checkpoint, RelativeDifference(chunked.loss, plain.loss), worst_grad);
    }
  }
}

TEST(ChunkedLossTest, TheBackwardRunsOnceAndSaysSoWhenAskedAgain) {
  at::manual_seed(8);
  at::Tensor h = torch::randn({2, 5, 8}).requires_grad_(true);
  at::Tensor w = torch::randn({20, 8}).requires_grad_(true);
  const at::Tensor targets = torch::randint(0, 20, {2, 5}, torch::kInt64);
  at::Tensor loss = ChunkedHeadCrossEntropy(h, w, targets, 3, LossReduction::kMean, 0, 0);
  EXPECT_THAT(loss.grad_fn()->name(), HasSubstr("FusedLinearCrossEntropy"));
  loss.backward({}, /*retain_graph=*/true);
  try {
    loss.backward();
    ADD_FAILURE() << "a second backward ran";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("runs once"));
  }
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
