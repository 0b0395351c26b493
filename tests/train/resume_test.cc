// What a checkpoint saves of training, round-tripped: the optimizer state
// (FusedAdamW::StateOf / SetStateOf and the trainer's named tensors), the
// trainer state with the data generator's bytes through trainer_state.json,
// and a restored trainer continuing a run with the very losses of the run
// that was never interrupted.

#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "core/train/adamw.h"
#include "core/train/trainer.h"
#include "core/train/trainer_state.h"
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
using ::testing::Not;
using testing::SmallLlamaConfig;

TrainOptions Options(int64_t steps) {
  TrainOptions o;
  o.steps = steps;
  o.batch_size = 4;
  o.seq_len = 32;
  o.seed = 11;
  o.weight_decay = 0.1;
  o.max_grad_norm = 1.0;
  return o;
}

// Deep copies, as a checkpoint's files hold them (nothing shared with the
// live tensors).
std::vector<std::pair<std::string, at::Tensor>> Copies(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, t] : tensors) out.emplace_back(name, t.detach().clone());
  return out;
}

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes().equals(b.sizes()) && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) ==
             0;
}

TEST(TrainerStateTest, JsonRoundTripKeepsEveryBit) {
  TrainerState s;
  s.global_step = 20;
  RunState run;
  run.options = Options(40);
  run.options.learning_rate = 0.1;  // not exact in binary: the text must read back
  run.options.seed = std::numeric_limits<uint64_t>::max();
  run.options.data.kind = DataSpec::Kind::kInlineTokens;
  run.options.data.tokens = {1, 2, 255};
  run.options.gradient_checkpointing = true;
  run.options.attn_implementation = AttentionImplementation::kEager;
  run.options.lr_schedule.type = LrSchedulerType::kCosineWithMinLr;
  run.options.lr_schedule.warmup_steps = 4;
  run.options.lr_schedule.min_lr_ratio = 0.1;
  run.options.mixed_precision = MixedPrecision::kBf16;
  run.options.eval_every_steps = 5;
  run.options.eval_data = DataSpec();
  run.options.eval_data->kind = DataSpec::Kind::kTextFile;
  run.options.eval_data->path = "/data/eval.txt";
  run.options.eval_max_batches = 3;
  run.steps_completed = 20;
  run.data_tokens = 3;
  run.sampler.seed = run.options.seed;
  for (int i = 0; i < 5056; ++i)
    run.sampler.generator_state.push_back(static_cast<char>(i * 7));
  run.sampler.batches_drawn = 20;
  run.sampler.windows_drawn = 80;
  s.run = run;
  s.recent_losses = {{19, 1.0 / 3.0},
                     {20, 5.421010862427522e-20},
                     {21, std::numeric_limits<double>::quiet_NaN()}};

  const std::string text = TrainerStateToJson(s);
  EXPECT_THAT(text, HasSubstr("\"memprofd_version\""));
  EXPECT_THAT(text, HasSubstr("\"format_version\": 1"));
  absl::StatusOr<TrainerState> back = TrainerStateFromJson(text, "x/trainer_state.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->global_step, 20);
  ASSERT_TRUE(back->run.has_value());
  const RunState& r = *back->run;
  EXPECT_EQ(r.options.learning_rate, 0.1);
  EXPECT_EQ(r.options.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(r.options.data.kind, DataSpec::Kind::kInlineTokens);
  EXPECT_EQ(r.options.data.tokens, (std::vector<int64_t>{1, 2, 255}));
  EXPECT_TRUE(r.options.gradient_checkpointing);
  EXPECT_EQ(r.options.attn_implementation, AttentionImplementation::kEager);
  // The schedule's shape, precision and evaluation survive too, so a resumed
  // run's learning rates and evaluations are the uninterrupted run's.
  EXPECT_EQ(r.options.lr_schedule.type, LrSchedulerType::kCosineWithMinLr);
  EXPECT_EQ(r.options.lr_schedule.warmup_steps, 4);
  EXPECT_EQ(r.options.lr_schedule.min_lr_ratio, 0.1);
  EXPECT_EQ(r.options.mixed_precision, MixedPrecision::kBf16);
  EXPECT_EQ(r.options.eval_every_steps, 5);
  ASSERT_TRUE(r.options.eval_data.has_value());
  EXPECT_EQ(r.options.eval_data->kind, DataSpec::Kind::kTextFile);
  EXPECT_EQ(r.options.eval_data->path, "/data/eval.txt");
  EXPECT_EQ(r.options.eval_max_batches, 3);
  EXPECT_EQ(r.options.weight_decay, 0.1);
  EXPECT_EQ(r.options.max_grad_norm, 1.0);
  EXPECT_EQ(r.options.steps, 40);
  EXPECT_EQ(r.steps_completed, 20);
  EXPECT_EQ(r.sampler.generator_state, run.sampler.generator_state);
  EXPECT_EQ(r.sampler.windows_drawn, 80);
  ASSERT_EQ(back->recent_losses.size(), 3u);
  EXPECT_EQ(back->recent_losses[0].second, 1.0 / 3.0);
  EXPECT_EQ(back->recent_losses[1].second, 5.421010862427522e-20);
  EXPECT_TRUE(std::isnan(back->recent_losses[2].second));

  EXPECT_EQ(back->lora_base_fingerprint, "");
  EXPECT_THAT(text, Not(HasSubstr("lora_base_fingerprint")));  // states as before
  s.lora_base_fingerprint = "0123456789abcdef";
  back = TrainerStateFromJson(TrainerStateToJson(s), "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->lora_base_fingerprint, "0123456789abcdef");

  TrainerState fresh;  // before any run
  back = TrainerStateFromJson(TrainerStateToJson(fresh), "y");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->run.has_value());
}

TEST(TrainerStateTest, DamagedTextIsDataLossNamingTheField) {
  TrainerState s;
  s.run = RunState();
  std::string text = TrainerStateToJson(s);
  for (const std::string& bad :
       {std::string("{"), std::string("[]"),
        [&] {  // a required field missing
          std::string t = text;
          t.replace(t.find("\"global_step\""), 13, "\"global_stepX\"");
          return t;
        }(),
        [&] {
          std::string t = text;
          t.replace(t.find("\"format_version\": 1"), 19, "\"format_version\": 9");
          return t;
        }(),
        [&] {
          std::string t = text;
          t.replace(t.find("\"batch_size\": 8"), 15, "\"batch_size\": \"8\"");
          return t;
        }()}) {
    absl::StatusOr<TrainerState> r = TrainerStateFromJson(bad, "ck/trainer_state.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("ck/trainer_state.json"));
  }
  std::string t = text;
  t.replace(t.find("\"batch_size\": 8"), 15, "\"batch_size\": \"8\"");
  EXPECT_THAT(TrainerStateFromJson(t, "p").status().message(),
              HasSubstr("run.config.batch_size"));
}

TEST(FusedAdamWTest, StateCopiedIntoAFreshOptimizerContinuesBitForBit) {
  torch::manual_seed(3);
  std::vector<at::Tensor> a = {torch::randn({8, 5}).requires_grad_(),
                               torch::randn({7}).requires_grad_()};
  std::vector<at::Tensor> b;
  for (const at::Tensor& p : a) b.push_back(p.detach().clone().requires_grad_());
  FusedAdamW::Options o;
  o.learning_rate = 1e-2;
  o.weight_decay = 0.1;
  FusedAdamW first({a}, {o});
  auto grads = [](std::vector<at::Tensor>& ps, int k) {
    torch::manual_seed(50 + k);
    for (at::Tensor& p : ps) p.mutable_grad() = torch::randn(p.sizes());
  };
  for (int k = 0; k < 3; ++k) {
    grads(a, k);
    first.Step();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    torch::NoGradGuard no_grad;
    b[i].copy_(a[i]);
  }
  FusedAdamW second({b}, {o});
  EXPECT_FALSE(second.StateOf(b[0]).has_value());  // no update yet
  for (size_t i = 0; i < a.size(); ++i) {
    std::optional<FusedAdamW::ParamState> s = first.StateOf(a[i]);
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->step.item<float>(), 3.0f);
    EXPECT_EQ(s->step.scalar_type(), at::kFloat);
    FusedAdamW::ParamState copy{s->exp_avg.clone(), s->exp_avg_sq.clone(),
                                s->step.clone()};
    ASSERT_TRUE(second.SetStateOf(b[i], copy));
  }
  // A shape that does not fit is refused.
  FusedAdamW::ParamState wrong{torch::zeros({2}), torch::zeros({2}), torch::zeros({})};
  EXPECT_FALSE(second.SetStateOf(b[0], wrong));
  EXPECT_FALSE(second.SetStateOf(torch::zeros({8, 5}), *first.StateOf(a[0])));
  for (int k = 3; k < 6; ++k) {
    grads(a, k);
    grads(b, k);
    first.Step();
    second.Step();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(BitEqual(a[i].detach(), b[i].detach())) << i;
    EXPECT_TRUE(
        BitEqual(first.StateOf(a[i])->exp_avg_sq, second.StateOf(b[i])->exp_avg_sq));
  }
}

TEST(ResumeTest, ARestoredTrainerContinuesTheRunWithTheSameLossesBitForBit) {
  for (int variant : {0, 1, 2}) {
    const bool checkpointing = variant == 1;
    SCOPED_TRACE(variant == 0   ? "plain"
                 : variant == 1 ? "gradient checkpointing"
                                : "cosine schedule with warmup");
    TrainOptions o = Options(6);
    o.gradient_checkpointing = checkpointing;
    o.grad_accumulation_steps = 2;
    if (variant == 2) {
      // The rate of a resumed step is the schedule's at its place in the
      // whole run (steps 4..6 of 6), not at the start of a new one.
      o.lr_schedule.type = LrSchedulerType::kCosine;
      o.lr_schedule.warmup_steps = 2;
    }
    // The run never interrupted.
    std::vector<double> reference, reference_lr;
    {
      std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
      Trainer trainer(m.get());
      ASSERT_TRUE(CheckAndRun(trainer, o, Request([&](const StepReport& r) {
                                reference.push_back(r.loss);
                                reference_lr.push_back(r.learning_rate);
                              }))
                      .ok());
    }
    ASSERT_EQ(reference.size(), 6u);

    // The same run stopped after 3 steps, its state saved as a checkpoint
    // holds it (JSON text, tensor copies), the trainer destroyed.
    std::string state_json;
    std::vector<std::pair<std::string, at::Tensor>> weights, optimizer;
    {
      std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
      Trainer trainer(m.get());
      int done = 0;
      absl::StatusOr<TrainResult> r = CheckAndRun(
          trainer, o,
          Request([&](const StepReport&) { ++done; }, [&] { return done == 3; }));
      ASSERT_TRUE(r.ok());
      ASSERT_TRUE(r->cancelled);
      state_json = TrainerStateToJson(trainer.State());
      weights = Copies(m->NamedParameters());
      optimizer = Copies(trainer.NamedOptimizerState());
      // Three per distinct parameter (the tied head is the embedding).
      EXPECT_EQ(optimizer.size(), 3 * m->Parameters().size());
      EXPECT_EQ(trainer.OptimizerMetadata().at("group.decay.weight_decay"),
                "0.10000000000000001");
    }

    // A new model (other init seed) and trainer restored from it.
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 99);
    ASSERT_TRUE(m->LoadStateDict(weights).ok());
    Trainer trainer(m.get());
    absl::StatusOr<TrainerState> state = TrainerStateFromJson(state_json, "t");
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->run->sampler.batches_drawn, 6);  // 3 steps x 2 micro-batches
    EXPECT_EQ(state->run->sampler.windows_drawn, 24);
    ASSERT_EQ(state->recent_losses.size(), 3u);
    EXPECT_EQ(state->recent_losses[2].second, reference[2]);
    ASSERT_TRUE(trainer.Restore(*state, optimizer).ok());
    EXPECT_EQ(trainer.global_step(), 3);
    absl::StatusOr<std::unique_ptr<TokenDataset>> data =
        TokenDataset::Create(o.data, 256);
    ASSERT_TRUE(data.ok());
    TrainOptions rest = o;
    rest.steps = 3;
    std::vector<double> resumed, resumed_lr;
    std::vector<int64_t> global;
    absl::StatusOr<TrainResult> r =
        CheckAndRun(trainer, rest,
                    Request(
                        [&](const StepReport& s) {
                          resumed.push_back(s.loss);
                          resumed_lr.push_back(s.learning_rate);
                          global.push_back(s.global_step);
                        },
                        {}, {}, &**data, nullptr, true));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(global, (std::vector<int64_t>{4, 5, 6}));
    EXPECT_EQ(resumed, std::vector<double>(reference.begin() + 3, reference.end()));
    EXPECT_EQ(resumed_lr,
              std::vector<double>(reference_lr.begin() + 3, reference_lr.end()));
    if (variant == 2) {
      EXPECT_NE(reference_lr[3], reference_lr[5]);
    }
    EXPECT_EQ(trainer.run()->steps_completed, 6);
    EXPECT_EQ(trainer.run()->options.steps, 6);
  }
}

TEST(ResumeTest, RestoreRefusesAnotherModelsStateAndChangesNothing) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  ASSERT_TRUE(CheckAndRun(trainer, Options(1)).ok());
  const TrainerState state = trainer.State();
  std::vector<std::pair<std::string, at::Tensor>> optimizer =
      Copies(trainer.NamedOptimizerState());

  LlamaConfig other = SmallLlamaConfig();
  other.hidden_size *= 2;
  other.intermediate_size *= 2;
  std::unique_ptr<LlamaModel> wider = MakeLlama(other, 5);
  Trainer fresh(wider.get());
  absl::Status s = fresh.Restore(state, optimizer);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("another model shape"));
  EXPECT_THAT(s.message(), HasSubstr(".exp_avg"));
  EXPECT_EQ(fresh.global_step(), 0);
  EXPECT_FALSE(fresh.run().has_value());
  EXPECT_TRUE(fresh.OptimizerState().empty());

  // A missing part and an unknown name, on the right model.
  std::unique_ptr<LlamaModel> same = MakeLlama(SmallLlamaConfig(), 5);
  Trainer again(same.get());
  std::vector<std::pair<std::string, at::Tensor>> partial(optimizer.begin() + 1,
                                                          optimizer.end());
  s = again.Restore(state, partial);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("lacks model.embed_tokens.weight.exp_avg"));
  std::vector<std::pair<std::string, at::Tensor>> extra = optimizer;
  extra.emplace_back("model.layers.99.mlp.up_proj.weight.exp_avg", torch::zeros({1}));
  s = again.Restore(state, extra);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("model.layers.99.mlp.up_proj.weight.exp_avg"));
  // None: a trained checkpoint without optimizer state for a parameter.
  std::vector<std::pair<std::string, at::Tensor>> without(optimizer.begin() + 3,
                                                          optimizer.end());
  s = again.Restore(state, without);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("no optimizer state for model.embed_tokens.weight"));
  // A generator state of the wrong size.
  TrainerState damaged = state;
  damaged.run->sampler.generator_state = "short";
  s = again.Restore(damaged, optimizer);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(again.global_step(), 0);
  EXPECT_TRUE(again.Restore(state, optimizer).ok());
  EXPECT_EQ(again.global_step(), 1);
}

// A rank of a sharded run restores its flat piece of every parameter's
// state, bit for bit: the ranks' pieces laid end to end are the whole state
// (3 ranks, so some parameters' last piece is short or empty); a parameter
// without state is refused.
TEST(ResumeTest, RestoreOfAShardKeepsExactlyItsPieces) {
  std::string state_json;
  std::vector<std::pair<std::string, at::Tensor>> optimizer;
  std::vector<std::string> params;
  {
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
    Trainer trainer(m.get());
    ASSERT_TRUE(CheckAndRun(trainer, Options(2)).ok());
    state_json = TrainerStateToJson(trainer.State());
    optimizer = Copies(trainer.NamedOptimizerState());
    for (const auto& [name, t] : optimizer) {
      if (absl::EndsWith(name, ".exp_avg"))
        params.push_back(name.substr(0, name.size() - 8));
    }
  }
  ASSERT_GE(params.size(), 2u);
  absl::StatusOr<TrainerState> state = TrainerStateFromJson(state_json, "t");
  ASSERT_TRUE(state.ok()) << state.status();
  constexpr int kWorld = 3;
  std::map<std::string, std::vector<at::Tensor>> pieces;  // per tensor, by rank
  for (int rank = 0; rank < kWorld; ++rank) {
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
    Trainer trainer(m.get());
    const FlatShardSpec shard{rank, kWorld};
    ASSERT_TRUE(trainer.Restore(*state, optimizer, &shard).ok());
    for (const auto& [name, t] : trainer.NamedOptimizerState()) {
      if (absl::EndsWith(name, ".step")) continue;
      EXPECT_EQ(t.dim(), 1) << name;
      pieces[name].push_back(t.clone());
    }
  }
  for (const auto& [name, t] : optimizer) {
    if (absl::EndsWith(name, ".step")) continue;
    ASSERT_EQ(pieces.count(name), 1u) << name;
    const at::Tensor whole = at::cat(pieces.at(name));
    EXPECT_TRUE(BitEqual(whole, t.reshape({-1}))) << name;
  }
  {
    // A parameter's state missing: refused, naming it.
    std::vector<std::pair<std::string, at::Tensor>> partial;
    for (const auto& [name, t] : optimizer) {
      if (!absl::StartsWith(name, params[1] + ".")) partial.emplace_back(name, t);
    }
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
    Trainer trainer(m.get());
    const FlatShardSpec shard{1, kWorld};
    absl::Status s = trainer.Restore(*state, partial, &shard);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr(params[1]));
  }
}

// An optimizer made for sharding before any step (a data-parallel run makes
// it to narrow its state) has no hyperparameters to report yet (a step
// gives them: ARestoredTrainerContinues... checks them), and a
// sharded trainer refuses a step that no data-parallel run of its ranks
// feeds, which would train nothing.
TEST(ResumeTest, ShardedOptimizerNeedsItsDataParallelRunAndReportsOnlySetOptions) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  ASSERT_TRUE(trainer.ShardOptimizer({1, 2}).ok());
  ASSERT_NE(trainer.optimizer(), nullptr);
  EXPECT_EQ(trainer.OptimizerMetadata().count("group.decay.lr"), 0u);
  EXPECT_EQ(trainer.ShardOptimizer({0, 2}).code(), absl::StatusCode::kInternal);
  // Without the data-parallel run that feeds the pieces, a step is refused
  // rather than training nothing.
  absl::StatusOr<TrainResult> alone = CheckAndRun(trainer, Options(1));
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(alone.status().message(), HasSubstr("rank 1 of 2"));
  EXPECT_EQ(trainer.OptimizerMetadata().count("group.decay.lr"), 0u);
}

TEST(ResumeTest, ContinuingWithoutARunIsFailedPrecondition) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  absl::StatusOr<std::unique_ptr<TokenDataset>> data =
      TokenDataset::Create(DataSpec(), 256);
  ASSERT_TRUE(data.ok());
  absl::StatusOr<TrainResult> r =
      CheckAndRun(trainer, Options(1), Request({}, {}, {}, &**data, nullptr, true));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("no training run to resume"));
}

}  // namespace
}  // namespace memprofd
