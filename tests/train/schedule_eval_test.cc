// Learning-rate schedules against values worked out by hand, the trainer's
// use of them, evaluation against a window-by-window computation, periodic
// evaluation in a run, and bf16 autocast (float32 master weights, the same
// gradients with checkpointing).

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "core/train/autocast.h"
#include "core/train/data.h"
#include "core/train/evaluate.h"
#include "core/train/lr_schedule.h"
#include "core/train/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/llama.h"
#include "tests/testing/train.h"

namespace memprofd {
namespace {

using testing::CheckAndRun;
using testing::Request;

using ::testing::HasSubstr;
using testing::MakeLlama;
using testing::SmallLlamaConfig;

TrainOptions Options(int64_t steps) {
  TrainOptions o;
  o.steps = steps;
  o.batch_size = 4;
  o.seq_len = 32;
  o.seed = 9;
  return o;
}

LrSchedule Schedule(LrSchedulerType type, int64_t warmup, double min_lr_ratio = 0) {
  LrSchedule s;
  s.type = type;
  s.warmup_steps = warmup;
  s.min_lr_ratio = min_lr_ratio;
  return s;
}

TEST(LrScheduleTest, FactorsEqualTheFormulasWorkedOutByHand) {
  // constant: 1 everywhere.
  EXPECT_EQ(LrFactor(Schedule(LrSchedulerType::kConstant, 0), 7, 10), 1.0);
  // constant_with_warmup, 4 warmup steps: 0, 1/4, 2/4, 3/4, then 1.
  const LrSchedule cw = Schedule(LrSchedulerType::kConstantWithWarmup, 4);
  EXPECT_EQ(LrFactor(cw, 0, 10), 0.0);
  EXPECT_EQ(LrFactor(cw, 1, 10), 0.25);
  EXPECT_EQ(LrFactor(cw, 3, 10), 0.75);
  EXPECT_EQ(LrFactor(cw, 4, 10), 1.0);
  EXPECT_EQ(LrFactor(cw, 9, 10), 1.0);
  // linear, 2 warmup steps of 10: 0, 1/2, then (10 - s) / 8.
  const LrSchedule lin = Schedule(LrSchedulerType::kLinear, 2);
  EXPECT_EQ(LrFactor(lin, 0, 10), 0.0);
  EXPECT_EQ(LrFactor(lin, 1, 10), 0.5);
  EXPECT_EQ(LrFactor(lin, 2, 10), 1.0);
  EXPECT_EQ(LrFactor(lin, 6, 10), 0.5);
  EXPECT_EQ(LrFactor(lin, 9, 10), 0.125);
  EXPECT_EQ(LrFactor(lin, 10, 10), 0.0);
  // cosine without warmup over 4 steps: (1 + cos(pi * s / 4)) / 2.
  const LrSchedule cos = Schedule(LrSchedulerType::kCosine, 0);
  EXPECT_DOUBLE_EQ(LrFactor(cos, 0, 4), 1.0);
  EXPECT_DOUBLE_EQ(LrFactor(cos, 1, 4), 0.8535533905932737);  // (1 + sqrt(2)/2) / 2
  EXPECT_DOUBLE_EQ(LrFactor(cos, 2, 4), 0.5);
  EXPECT_DOUBLE_EQ(LrFactor(cos, 3, 4), 0.14644660940672624);
  EXPECT_NEAR(LrFactor(cos, 4, 4), 0.0, 1e-16);
  // cosine with 2 warmup steps of 6: 0, 1/2, then over the 4 steps left.
  const LrSchedule cosw = Schedule(LrSchedulerType::kCosine, 2);
  EXPECT_EQ(LrFactor(cosw, 1, 6), 0.5);
  EXPECT_DOUBLE_EQ(LrFactor(cosw, 4, 6), 0.5);
  // cosine_with_min_lr, floor 0.1: 0.1 + 0.9 * cosine.
  const LrSchedule floor = Schedule(LrSchedulerType::kCosineWithMinLr, 0, 0.1);
  EXPECT_DOUBLE_EQ(LrFactor(floor, 2, 4), 0.55);
  EXPECT_DOUBLE_EQ(LrFactor(floor, 4, 4), 0.1);
  EXPECT_DOUBLE_EQ(LearningRateAt(floor, 2e-3, 2, 4), 1.1e-3);
}

TEST(LrScheduleTest, NamesRoundTripAndBadOnesListTheValidNames) {
  for (const char* name :
       {"constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr"}) {
    absl::StatusOr<LrSchedulerType> t = ParseLrSchedulerType(name);
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_EQ(LrSchedulerTypeName(*t), name);
  }
  absl::Status bad = ParseLrSchedulerType("cosine_with_restarts").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("constant, constant_with_warmup, linear, cosine, "
                                       "cosine_with_min_lr"));
}

TEST(LrScheduleTest, MergeRejectsWarmupBeyondStepsAndMisplacedOptions) {
  TrainOverrides r;
  r.steps = 10;
  r.lr_scheduler_type = "linear";
  r.warmup_steps = 11;
  absl::Status s = MergeTrainOverrides(TrainOptions(), r, 512).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("warmup_steps must be in [0, steps] = [0, 10]"));
  r.warmup_steps = 10;
  EXPECT_TRUE(MergeTrainOverrides(TrainOptions(), r, 512).ok());
  r.lr_scheduler_type = "warmup_stable_decay";
  EXPECT_THAT(MergeTrainOverrides(TrainOptions(), r, 512).status().message(),
              HasSubstr("use one of constant,"));
  r.lr_scheduler_type.reset();  // constant: no warmup
  EXPECT_THAT(MergeTrainOverrides(TrainOptions(), r, 512).status().message(),
              HasSubstr("constant_with_warmup"));
  r.warmup_steps.reset();
  r.min_lr_ratio = 0.1;
  EXPECT_THAT(MergeTrainOverrides(TrainOptions(), r, 512).status().message(),
              HasSubstr("cosine_with_min_lr only"));
  r.lr_scheduler_type = "cosine_with_min_lr";
  r.min_lr_ratio = 1.5;
  EXPECT_THAT(MergeTrainOverrides(TrainOptions(), r, 512).status().message(),
              HasSubstr("min_lr_ratio must be in [0, 1]"));
  r.min_lr_ratio = 0.1;
  r.mixed_precision = "fp16";
  EXPECT_THAT(MergeTrainOverrides(TrainOptions(), r, 512).status().message(),
              HasSubstr("use no (float32) or bf16"));
  r.mixed_precision = "bf16";
  r.eval_every_steps = 2;
  EXPECT_THAT(MergeTrainOverrides(TrainOptions(), r, 512).status().message(),
              HasSubstr("eval_data is not"));
  r.eval_data = DataSpec();
  absl::StatusOr<TrainOptions> o = MergeTrainOverrides(TrainOptions(), r, 512);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->lr_schedule.type, LrSchedulerType::kCosineWithMinLr);
  EXPECT_EQ(o->mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(o->eval_every_steps, 2);
}

TEST(TrainerScheduleTest, EachStepUsesItsScheduledRateAndWarmupStartsAtZero) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  std::vector<at::Tensor> initial;
  for (const at::Tensor& p : m->Parameters()) initial.push_back(p.detach().clone());
  Trainer trainer(m.get());
  TrainOptions o = Options(4);
  o.learning_rate = 3e-3;
  o.lr_schedule = Schedule(LrSchedulerType::kLinear, 1);
  std::vector<double> rates;
  int unchanged_after_first = -1;
  ASSERT_TRUE(CheckAndRun(trainer, o, Request([&](const StepReport& r) {
                            rates.push_back(r.learning_rate);
                            if (r.step != 1) return;
                            unchanged_after_first = 1;
                            std::vector<at::Tensor> now = m->Parameters();
                            for (size_t i = 0; i < now.size(); ++i) {
                              if (!torch::equal(now[i], initial[i]))
                                unchanged_after_first = 0;
                            }
                          }))
                  .ok());
  // Warmup 1 of 4: 0, then (4 - s) / 3 of the peak.
  EXPECT_THAT(rates,
              ::testing::ElementsAre(0.0, 3e-3, 3e-3 * (2.0 / 3.0), 3e-3 * (1.0 / 3.0)));
  // A zero learning rate (and no weight decay) leaves AdamW's update at zero.
  EXPECT_EQ(unchanged_after_first, 1);
  EXPECT_FALSE(torch::equal(m->Parameters()[0], initial[0]));
}

std::unique_ptr<TokenDataset> Tokens(int64_t n, uint64_t seed) {
  DataSpec spec;
  spec.kind = DataSpec::Kind::kInlineTokens;
  at::Generator generator = MakeDataGenerator(seed);
  at::Tensor ids =
      at::randint(0, 256, {n}, generator, torch::TensorOptions().dtype(torch::kInt64));
  for (int64_t i = 0; i < n; ++i) spec.tokens.push_back(ids[i].item<int64_t>());
  absl::StatusOr<std::unique_ptr<TokenDataset>> data = TokenDataset::Create(spec, 256);
  EXPECT_TRUE(data.ok()) << data.status();
  return *std::move(data);
}

TEST(EvaluateTest, LossIsTheMeanCrossEntropyOverConsecutiveWindows) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  // 7 windows of 16 + 1 tokens (and 3 tokens left over), 3 to a batch.
  std::unique_ptr<TokenDataset> data = Tokens(7 * 16 + 4, 1);
  EvalOptions o;
  o.batch_size = 3;
  o.seq_len = 16;
  EXPECT_EQ(EvalWindows(*data, o), 7);
  absl::StatusOr<EvalResult> r = EvaluateModel(*m, *data, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->batches, 3);
  EXPECT_EQ(r->tokens, 7 * 16);
  // The same windows one at a time, each loss a mean over 16 tokens.
  double sum = 0;
  const at::Tensor tokens = data->Window(0, data->size()).value();
  for (int64_t w = 0; w < 7; ++w) {
    at::Tensor window = tokens.narrow(0, w * 16, 17);
    torch::NoGradGuard no_grad;
    at::Tensor logits = m->Forward(window.narrow(0, 0, 16).unsqueeze(0));
    sum += torch::nn::functional::cross_entropy(logits.view({16, 256}),
                                                window.narrow(0, 1, 16))
               .item<double>();
  }
  EXPECT_NEAR(r->loss, sum / 7, 1e-6);
  EXPECT_NEAR(r->perplexity, std::exp(sum / 7), 1e-4);
  for (const at::Tensor& p : m->Parameters()) EXPECT_FALSE(p.grad().defined());

  o.max_batches = 2;
  absl::StatusOr<EvalResult> two = EvaluateModel(*m, *data, o);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->tokens, 6 * 16);
  // A cancel is seen before the next batch: polled before batches 2 and 3.
  int polls = 0;
  absl::StatusOr<EvalResult> cancelled =
      EvaluateModel(*m, *data, o, [&] { return ++polls == 1; });
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(cancelled.status().message(), HasSubstr("after 1 of 2 batches"));
  o.seq_len = 200;
  EXPECT_THAT(EvaluateModel(*m, *data, o).status().message(),
              HasSubstr("max_position_embeddings (64)"));
  o.seq_len = 16;
  o.batch_size = 0;
  EXPECT_EQ(EvaluateModel(*m, *data, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EvaluateTest, RunsEvaluateEveryNStepsAndReportThem) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  std::unique_ptr<TokenDataset> train = Tokens(2000, 2);
  std::unique_ptr<TokenDataset> held_out = Tokens(500, 3);
  Trainer trainer(m.get());
  TrainOptions o = Options(5);
  o.eval_every_steps = 2;
  o.eval_data = DataSpec();
  o.eval_max_batches = 2;
  std::vector<int64_t> evaluated;
  double last_eval = 0;
  ASSERT_TRUE(CheckAndRun(trainer, o,
                          Request(
                              [&](const StepReport& r) {
                                if (!r.eval) return;
                                evaluated.push_back(r.step);
                                EXPECT_EQ(r.eval->tokens, 2 * 4 * 32);
                                EXPECT_EQ(r.eval->global_step, r.global_step);
                                last_eval = r.eval->loss;
                              },
                              {}, {}, &*train, held_out.get()))
                  .ok());
  EXPECT_THAT(evaluated, ::testing::ElementsAre(2, 4));
  // Due evaluations with no evaluation data, given or named, run nothing.
  TrainOptions no_eval_data = o;
  no_eval_data.eval_data.reset();
  EXPECT_EQ(
      CheckAndRun(trainer, no_eval_data, Request({}, {}, {}, &*train)).status().code(),
      absl::StatusCode::kInvalidArgument);
  TrainRunRequest request;
  request.data = train.get();
  EXPECT_EQ(trainer.Run(*trainer.Check(o), request).status().code(),
            absl::StatusCode::kOk)
      << "a named eval_data source is read when none is given";
  // Step 4's evaluation saw the weights before step 5 changed them.
  absl::StatusOr<EvalResult> now = EvaluateModel(*m, *held_out, EvalOptionsOf(o));
  ASSERT_TRUE(now.ok());
  EXPECT_NE(now->loss, last_eval);
}

std::vector<double> Losses(const TrainOptions& o, uint64_t seed,
                           std::vector<at::Tensor>* params = nullptr,
                           std::vector<at::Tensor>* state = nullptr) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), seed);
  Trainer trainer(m.get());
  std::vector<double> losses;
  absl::StatusOr<TrainResult> r = CheckAndRun(
      trainer, o, Request([&](const StepReport& s) { losses.push_back(s.loss); }));
  EXPECT_TRUE(r.ok()) << r.status();
  if (params) *params = m->Parameters();
  if (state) *state = trainer.OptimizerState();
  return losses;
}

TEST(MixedPrecisionTest, Bf16KeepsFloat32MasterWeightsAndStateAndTracksFloat32) {
  TrainOptions o = Options(4);
  const std::vector<double> fp32 = Losses(o, 5);
  o.mixed_precision = MixedPrecision::kBf16;
  std::vector<at::Tensor> params, state;
  const std::vector<double> bf16 = Losses(o, 5, &params, &state);
  ASSERT_EQ(bf16.size(), 4u);
  for (const at::Tensor& p : params) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  ASSERT_FALSE(state.empty());
  for (const at::Tensor& s : state) EXPECT_EQ(s.scalar_type(), torch::kFloat32);
  for (size_t i = 0; i < 4; ++i) {
    // bf16 rounds (8 significant bits), so the losses differ, by little.
    EXPECT_NE(bf16[i], fp32[i]) << i;
    EXPECT_NEAR(bf16[i], fp32[i], 0.02 * fp32[i]) << i;
  }
  // Autocast leaves nothing behind on this thread.
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
}

TEST(MixedPrecisionTest, AutocastGivesBf16ProjectionsAndAFloat32ResidualStream) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  const at::Tensor ids = torch::randint(0, 256, {2, 16}, torch::kInt64);
  torch::NoGradGuard no_grad;
  {
    AutocastScope autocast(MixedPrecision::kBf16, at::kCPU);
    EXPECT_EQ(CurrentMixedPrecision(at::kCPU), MixedPrecision::kBf16);
    // The residual stream (embedding + float32 sums) and the norms stay
    // float32, as in transformers under torch.autocast; the head is bf16.
    const at::Tensor hidden = m->Layer(0, m->Embed(ids));
    EXPECT_EQ(hidden.scalar_type(), torch::kFloat32);
    EXPECT_EQ(m->Forward(ids).scalar_type(), torch::kBFloat16);
    {
      AutocastScope off(MixedPrecision::kNo, at::kCPU);  // changes nothing
      EXPECT_EQ(CurrentMixedPrecision(at::kCPU), MixedPrecision::kBf16);
    }
  }
  EXPECT_EQ(CurrentMixedPrecision(at::kCPU), MixedPrecision::kNo);
  EXPECT_EQ(m->Forward(ids).scalar_type(), torch::kFloat32);
}

TEST(MixedPrecisionTest, CheckpointingReplaysTheAutocastBitForBit) {
  TrainOptions o = Options(3);
  o.mixed_precision = MixedPrecision::kBf16;
  std::vector<at::Tensor> plain_params;
  const std::vector<double> plain = Losses(o, 6, &plain_params);
  o.gradient_checkpointing = true;
  std::vector<at::Tensor> ckpt_params;
  const std::vector<double> ckpt = Losses(o, 6, &ckpt_params);
  // Steps 2 and 3 see the weights the first updates made: equal only when
  // the recomputation in backward ran in bf16 as the forward did.
  EXPECT_EQ(plain, ckpt);
  ASSERT_EQ(plain_params.size(), ckpt_params.size());
  for (size_t i = 0; i < plain_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain_params[i], ckpt_params[i])) << i;
  }
}

}  // namespace
}  // namespace memprofd
