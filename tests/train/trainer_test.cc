#include "core/train/trainer.h"

#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/phase.h"
#include "core/offload/offloader.h"
#include "core/offload/step_listener.h"
#include "core/train/adamw.h"
#include "core/train/checkpoint.h"
#include "core/train/data.h"
#include "core/train/evaluate.h"
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

TrainOptions SmallOptions(int64_t steps) {
  TrainOptions o;
  o.steps = steps;
  o.batch_size = 4;
  o.seq_len = 32;
  o.seed = 9;
  return o;
}

std::vector<at::Tensor> Gradients(const LlamaModel& m, bool checkpointing,
                                  const at::Tensor& ids) {
  for (const at::Tensor& p : m.Parameters()) p.mutable_grad() = at::Tensor();
  at::Tensor hidden = m.Embed(ids);
  for (int64_t i = 0; i < m.num_layers(); ++i) {
    hidden = checkpointing ? CheckpointedLayer(m, i, hidden) : m.Layer(i, hidden);
  }
  at::Tensor logits = m.Head(m.FinalNorm(hidden));
  torch::nn::functional::cross_entropy(logits.view({-1, 256}), ids.view({-1})).backward();
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : m.Parameters()) grads.push_back(p.grad().clone());
  return grads;
}

TEST(CheckpointTest, GradientsEqualThoseWithoutCheckpointing) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 3);
  at::Tensor ids = torch::randint(0, 256, {3, 24}, torch::kInt64);
  std::vector<at::Tensor> plain = Gradients(*m, false, ids);
  std::vector<at::Tensor> checkpointed = Gradients(*m, true, ids);
  ASSERT_EQ(plain.size(), checkpointed.size());
  int exactly_equal = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::allclose(plain[i], checkpointed[i], 1e-6, 1e-6)) << i;
    EXPECT_GT(plain[i].abs().max().item<double>(), 0) << i;
    exactly_equal += torch::equal(plain[i], checkpointed[i]);
  }
  EXPECT_EQ(exactly_equal, static_cast<int>(plain.size()));
}

TEST(CheckpointTest, SavesOnlyTheLayerInput) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 3);
  at::Tensor ids = torch::randint(0, 256, {2, 8}, torch::kInt64);
  at::Tensor hidden = m->Embed(ids);
  at::Tensor out = CheckpointedLayer(*m, 0, hidden);
  ASSERT_TRUE(out.grad_fn() != nullptr);
  // One node between the output and the layer's input and parameters.
  EXPECT_THAT(out.grad_fn()->name(), HasSubstr("CheckpointedLayerFunction"));
  EXPECT_EQ(out.grad_fn()->num_inputs(), 1u);
  EXPECT_EQ(out.grad_fn()->next_edges().size(), 1u + 9u);
}

TEST(CheckpointTest, FrozenParametersGetNoGradientAndStayPut) {
  // Layer 0 frozen, as a module placed on disk is.
  std::vector<double> losses[2];
  for (int checkpointing : {0, 1}) {
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 3);
    std::vector<at::Tensor> frozen = m->LayerParameters(0);
    std::vector<at::Tensor> before;
    for (at::Tensor& t : frozen) {
      t.requires_grad_(false);
      before.push_back(t.clone());
    }
    at::Tensor trained_before = m->LayerParameters(1)[0].detach().clone();
    Trainer trainer(m.get());
    TrainOptions o = SmallOptions(3);
    o.gradient_checkpointing = checkpointing;
    absl::StatusOr<TrainResult> r = CheckAndRun(
        trainer, o,
        Request([&](const StepReport& s) { losses[checkpointing].push_back(s.loss); }));
    ASSERT_TRUE(r.ok()) << r.status();
    for (size_t i = 0; i < frozen.size(); ++i)
      EXPECT_TRUE(torch::equal(frozen[i], before[i]));
    EXPECT_FALSE(torch::equal(m->LayerParameters(1)[0], trained_before));
    // Only trainable parameters carry optimizer state.
    EXPECT_EQ(trainer.OptimizerState().size(),
              2 * (m->Parameters().size() - frozen.size()));
  }
  EXPECT_EQ(losses[0], losses[1]);
}

TEST(TrainerTest, SameSeedGivesTheSameLossesBitForBit) {
  std::vector<double> first, second;
  for (std::vector<double>* losses : {&first, &second}) {
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
    Trainer trainer(m.get());
    TrainOptions o = SmallOptions(8);
    o.weight_decay = 0.1;
    o.max_grad_norm = 1.0;
    absl::StatusOr<TrainResult> r = CheckAndRun(
        trainer, o, Request([&](const StepReport& s) { losses->push_back(s.loss); }));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  ASSERT_EQ(first.size(), 8u);
  EXPECT_EQ(first, second);
  EXPECT_NEAR(first[0], std::log(256.0), 0.1);
}

// Options validated once (ValidTrainOptions) run as they are; options
// validated for a model of longer sequences are checked again for this one.
TEST(TrainerTest, ValidatedOptionsRunAndAreRecheckedForAModelOfShorterSequences) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);  // 64 positions
  Trainer trainer(m.get());
  TrainOverrides request;
  request.steps = 2;
  request.batch_size = 2;
  request.seq_len = 32;
  absl::StatusOr<ValidTrainOptions> valid =
      MergeTrainOverrides(TrainOptions(), request, 64);
  ASSERT_TRUE(valid.ok()) << valid.status();
  absl::StatusOr<std::unique_ptr<TokenDataset>> data =
      TokenDataset::Create(valid->get().data, 256);
  ASSERT_TRUE(data.ok()) << data.status();
  absl::StatusOr<TrainResult> r = trainer.Run(*valid, Request({}, {}, {}, &**data));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->steps_completed, 2);

  request.seq_len = 128;  // fits a model of 4096 positions, not this one
  valid = MergeTrainOverrides(TrainOptions(), request, 4096);
  ASSERT_TRUE(valid.ok()) << valid.status();
  r = trainer.Run(*valid, Request({}, {}, {}, &**data));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("max_position_embeddings"));
  EXPECT_EQ(MergeTrainOverrides(TrainOptions(), request, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TrainerTest, CheckpointingTrainsIdentically) {
  // Off, every layer, and the first one only (checkpoint_layers).
  std::vector<double> losses[3];
  for (int variant : {0, 1, 2}) {
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
    Trainer trainer(m.get());
    TrainOptions o = SmallOptions(4);
    o.gradient_checkpointing = variant > 0;
    if (variant == 2) o.checkpoint_layers = 1;
    ASSERT_TRUE(CheckAndRun(trainer, o, Request([&](const StepReport& s) {
                              losses[variant].push_back(s.loss);
                            }))
                    .ok());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(losses[0], losses[2]);
}

TEST(TrainerTest, CheckpointLayersPicksTheFirstLayersAndIsChecked) {
  TrainOptions o;
  EXPECT_FALSE(CheckpointsLayer(o, 0));
  o.gradient_checkpointing = true;
  EXPECT_TRUE(CheckpointsLayer(o, 0));
  EXPECT_TRUE(CheckpointsLayer(o, 7));  // 0: every layer
  o.checkpoint_layers = 2;
  EXPECT_TRUE(CheckpointsLayer(o, 1));
  EXPECT_FALSE(CheckpointsLayer(o, 2));
  EXPECT_TRUE(ValidateTrainOptions(o, 4096).ok());
  o.checkpoint_layers = -1;
  EXPECT_THAT(ValidateTrainOptions(o, 4096).message(), HasSubstr("checkpoint_layers"));
  o.checkpoint_layers = 2;
  o.gradient_checkpointing = false;
  EXPECT_THAT(ValidateTrainOptions(o, 4096).message(),
              HasSubstr("gradient_checkpointing"));
}

TEST(TrainerTest, ReportsEveryStep) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  TrainOptions o = SmallOptions(3);
  o.grad_accumulation_steps = 2;
  std::vector<StepReport> reports;
  absl::StatusOr<TrainResult> r = CheckAndRun(
      trainer, o, Request([&](const StepReport& s) { reports.push_back(s); }));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(reports.size(), 3u);
  for (size_t i = 0; i < reports.size(); ++i) {
    const StepReport& s = reports[i];
    EXPECT_EQ(s.step, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(s.global_step, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(s.tokens, 4 * 32 * 2);
    EXPECT_GT(s.loss, 0);
    EXPECT_GT(s.grad_norm, 0);
    EXPECT_GT(s.forward_seconds, 0);
    EXPECT_GT(s.backward_seconds, 0);
    EXPECT_GT(s.optimizer_seconds, 0);
    EXPECT_GE(s.step_seconds,
              s.forward_seconds + s.backward_seconds + s.optimizer_seconds);
    EXPECT_NEAR(s.tokens_per_second, s.tokens / s.step_seconds,
                1e-6 * s.tokens_per_second);
  }
  EXPECT_FALSE(r->cancelled);
  EXPECT_EQ(r->steps_completed, 3);
  EXPECT_EQ(r->tokens, 3 * 256);
  EXPECT_EQ(r->first_loss, reports[0].loss);
  EXPECT_EQ(r->last_loss, reports[2].loss);
  EXPECT_EQ(r->global_step, 3);
  EXPECT_GT(r->mean_tokens_per_second, 0);
  // Gradients are released after each step.
  for (const at::Tensor& p : m->Parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(TrainerTest, AccumulatedMicroBatchesEqualOneLargeBatch) {
  // Two micro-batches of 4 windows draw the same windows as one batch of 8.
  StepReport reports[2];
  for (int accum : {1, 2}) {
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
    Trainer trainer(m.get());
    TrainOptions o = SmallOptions(1);
    o.batch_size = 8 / accum;
    o.grad_accumulation_steps = accum;
    ASSERT_TRUE(CheckAndRun(trainer, o,
                            Request([&](const StepReport& s) { reports[accum - 1] = s; }))
                    .ok());
  }
  EXPECT_EQ(reports[0].tokens, reports[1].tokens);
  EXPECT_NEAR(reports[0].loss, reports[1].loss, 1e-5);
  EXPECT_NEAR(reports[0].grad_norm, reports[1].grad_norm, 1e-5 * reports[0].grad_norm);
}

TEST(TrainerTest, ClippingBoundsTheGradientNorm) {
  double change[2];
  double norms[2];
  for (int clip : {0, 1}) {
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
    at::Tensor before = m->Parameters()[1].detach().clone();
    Trainer trainer(m.get());
    TrainOptions o = SmallOptions(1);
    o.max_grad_norm = clip ? 1e-9 : 0.0;
    ASSERT_TRUE(CheckAndRun(trainer, o, Request([&](const StepReport& s) {
                              norms[clip] = s.grad_norm;
                            }))
                    .ok());
    change[clip] = (m->Parameters()[1] - before).abs().max().item<double>();
  }
  // The report gives the norm before clipping.
  EXPECT_EQ(norms[0], norms[1]);
  // Clipped to 1e-9, gradients fall far below AdamW's eps: tiny updates.
  EXPECT_GT(change[0], 5e-4);
  EXPECT_LT(change[1], 1e-4);
}

TEST(TrainerTest, ANonFiniteStepFailsAndLeavesTheWeightsAsTheyWere) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  TrainOptions o = SmallOptions(5);
  {
    torch::NoGradGuard no_grad;
    m->NamedParameters().back().second.view(-1)[0] = NAN;  // the head: a NaN loss
  }
  std::vector<at::Tensor> before;
  for (const at::Tensor& p : m->Parameters()) before.push_back(p.detach().clone());
  absl::StatusOr<TrainResult> r = CheckAndRun(trainer, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("non-finite loss"));
  EXPECT_THAT(r.status().message(), HasSubstr("update was skipped"));
  EXPECT_EQ(trainer.global_step(), 0);
  EXPECT_EQ(trainer.nonfinite_steps(), 1);
  const std::vector<at::Tensor> now = m->Parameters();
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_TRUE(torch::equal(now[i].nan_to_num(), before[i].nan_to_num())) << i;
  }
}

// An update that would take a parameter past kMaxParameterMagnitude (a
// learning rate of 1e30 makes every weight about 1e30, finite) is seen
// before it is made: the step fails, and the weights, the optimizer state
// and every later step are as if it had never been tried.
TEST(TrainerTest, AnUpdateThatDivergesIsNotApplied) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  std::unique_ptr<LlamaModel> fresh = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  TrainOptions o = SmallOptions(3);
  o.learning_rate = 1e30;
  std::vector<at::Tensor> before;
  for (const at::Tensor& p : m->Parameters()) before.push_back(p.detach().clone());
  absl::StatusOr<TrainResult> r = CheckAndRun(trainer, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("diverged"));
  EXPECT_THAT(r.status().message(), HasSubstr("not applied"));
  EXPECT_THAT(r.status().message(), HasSubstr(".weight"));  // names a parameter
  EXPECT_EQ(trainer.global_step(), 0);
  EXPECT_EQ(trainer.nonfinite_steps(), 1);
  const std::vector<at::Tensor> now = m->Parameters();
  ASSERT_EQ(now.size(), before.size());
  for (size_t i = 0; i < now.size(); ++i)
    EXPECT_TRUE(torch::equal(now[i], before[i])) << i;
  for (const at::Tensor& p : now)
    EXPECT_FALSE(trainer.optimizer()->StateOf(p)) << "state made";

  // The same run at a sane rate, on this trainer and on a fresh one: equal
  // losses bit for bit.
  o.learning_rate = 1e-3;
  std::vector<double> losses[2];
  Trainer fresh_trainer(fresh.get());
  ASSERT_TRUE(CheckAndRun(trainer, o, Request([&](const StepReport& s) {
                            losses[0].push_back(s.loss);
                          }))
                  .ok());
  ASSERT_TRUE(CheckAndRun(fresh_trainer, o, Request([&](const StepReport& s) {
                            losses[1].push_back(s.loss);
                          }))
                  .ok());
  EXPECT_EQ(losses[0].size(), 3u);
  EXPECT_EQ(losses[0], losses[1]);
}

// Records phase changes and step boundaries.
class RecordingListener : public PhaseListener {
 public:
  void OnStepBegin(int64_t step) override {
    events.push_back("begin" + std::to_string(step));
  }
  void OnStepEnd(int64_t step) override {
    events.push_back("end" + std::to_string(step));
  }
  void OnPhase(Phase phase) override { events.emplace_back(PhaseName(phase)); }
  std::vector<std::string> events;
};

// A step listener that logs every call into `events`, tagged with `name`.
class LoggingStepListener : public StepListener {
 public:
  LoggingStepListener(std::string name, std::vector<std::string>* events)
      : name_(std::move(name)), events_(events) {}
  absl::StatusOr<bool> AtBoundary() override {
    Log("boundary");
    return false;
  }
  void OnStepBegin(int64_t step) override { Log("begin" + std::to_string(step)); }
  std::shared_ptr<void> BodyScope() override { return Scope("body"); }
  std::shared_ptr<void> HeadScope() override {
    EXPECT_EQ(CurrentPhase(), Phase::kForward);
    return Scope("head");
  }
  void OnForwardEnd() override { Log("forward-end"); }
  void BeforeBackward(bool last) override { Log(last ? "backward-last" : "backward"); }
  absl::Status AfterBackward() override {
    Log("after-backward");
    return after_backward;
  }
  absl::Status OnStepEnd(StepReport& r) override {
    Log("end" + std::to_string(r.global_step));
    r.grad_norm = -1;  // visible to those after it, and to on_step
    return absl::OkStatus();
  }
  void OnStepFailed(const absl::Status& /*status*/, int64_t step) override {
    Log("failed" + std::to_string(step));
  }
  void OnStepReported(const StepReport& r) override {
    Log("reported" + std::to_string(r.global_step));
  }
  absl::Status after_backward;

 private:
  void Log(const std::string& what) { events_->push_back(name_ + ":" + what); }
  std::shared_ptr<void> Scope(const std::string& what) {
    Log(what + "+");
    return std::shared_ptr<void>(nullptr, [this, what](void*) { Log(what + "-"); });
  }
  const std::string name_;
  std::vector<std::string>* const events_;
};

TEST(TrainerTest, MarksPhasesAndCallsItsListenersInOrder) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  RecordingListener phases;
  LoggingStepListener a("a", &phases.events), b("b", &phases.events);
  SetPhaseListener(&phases);
  double seen_norm = 0;
  absl::StatusOr<TrainResult> r = CheckAndRun(
      trainer, SmallOptions(1),
      Request([&](const StepReport& s) { seen_norm = s.grad_norm; }, {}, {&a, &b}));
  SetPhaseListener(nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(phases.events,
              ::testing::ElementsAre(
                  "a:boundary", "b:boundary", "begin1", "a:begin1", "b:begin1", "forward",
                  "a:body+", "b:body+", "b:body-", "a:body-", "a:head+", "b:head+",
                  "b:head-", "a:head-", "idle", "a:forward-end", "b:forward-end",
                  "backward", "a:backward-last", "b:backward-last", "a:after-backward",
                  "b:after-backward", "idle", "optimizer", "idle", "a:end1", "b:end1",
                  "end1", "a:reported1", "b:reported1"));
  EXPECT_EQ(seen_norm, -1);
  EXPECT_EQ(CurrentStep(), 1);
}

TEST(TrainerTest, AListenersFailuresEndTheRun) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  std::vector<std::string> events;
  {
    // An AfterBackward error fails the step: no update, OnStepFailed not
    // called (the step's boundary did not throw), the run ends with it.
    Trainer trainer(m.get());
    LoggingStepListener failing("f", &events);
    failing.after_backward = absl::UnavailableError("peer gone");
    const std::vector<at::Tensor> before = [&] {
      std::vector<at::Tensor> v;
      for (const at::Tensor& p : m->Parameters()) v.push_back(p.detach().clone());
      return v;
    }();
    absl::StatusOr<TrainResult> r =
        CheckAndRun(trainer, SmallOptions(2), Request({}, {}, {&failing}));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(trainer.global_step(), 0);
    const std::vector<at::Tensor> now = m->Parameters();
    for (size_t i = 0; i < now.size(); ++i) EXPECT_TRUE(torch::equal(now[i], before[i]));
  }
  {
    // A boundary that says stop stops the run as a cancel does.
    class StopAtSecond : public StepListener {
     public:
      absl::StatusOr<bool> AtBoundary() override { return ++boundaries == 2; }
      int boundaries = 0;
    } stop;
    Trainer trainer(m.get());
    absl::StatusOr<TrainResult> r =
        CheckAndRun(trainer, SmallOptions(3), Request({}, {}, {&stop}));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->cancelled);
    EXPECT_EQ(r->steps_completed, 1);
  }
  {
    // A boundary error ends the run with it.
    class FailAtBoundary : public StepListener {
     public:
      absl::StatusOr<bool> AtBoundary() override {
        return absl::DeadlineExceededError("agreement timed out");
      }
    } fail;
    Trainer trainer(m.get());
    EXPECT_EQ(
        CheckAndRun(trainer, SmallOptions(1), Request({}, {}, {&fail})).status().code(),
        absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(trainer.global_step(), 0);
  }
}

TEST(TrainerTest, CancellationStopsBetweenStepsAndKeepsTheResult) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  int steps_seen = 0;
  absl::StatusOr<TrainResult> r = CheckAndRun(
      trainer, SmallOptions(10),
      Request([&](const StepReport&) { ++steps_seen; }, [&] { return steps_seen >= 3; }));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->cancelled);
  EXPECT_EQ(r->steps_completed, 3);
  EXPECT_EQ(trainer.global_step(), 3);
  // Training resumes where it stopped, with the optimizer state kept.
  r = CheckAndRun(trainer, SmallOptions(2));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->cancelled);
  EXPECT_EQ(r->global_step, 5);
}

TEST(TrainerTest, AnInterruptBetweenMicroBatchesAbandonsTheStepAndResumesExactly) {
  TrainOptions o = SmallOptions(3);
  o.grad_accumulation_steps = 3;
  std::unique_ptr<LlamaModel> ref_model = MakeLlama(SmallLlamaConfig(), 5);
  Trainer reference(ref_model.get());
  std::vector<double> losses;
  std::vector<at::Tensor> after_first;
  ASSERT_TRUE(CheckAndRun(reference, o, Request([&](const StepReport& s) {
                            losses.push_back(s.loss);
                            if (s.step != 1) return;
                            for (const at::Tensor& p : ref_model->Parameters())
                              after_first.push_back(p.detach().clone());
                          }))
                  .ok());

  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  // Polled at each step's boundary, before micro-batches 2 and 3 of each step
  // and, in each micro-batch of this 2-layer model, once in forward and once
  // in backward: 9 polls a step. Poll 13 is the one before the second step's
  // second micro-batch, after its first ran forward and backward.
  ASSERT_EQ(m->num_layers(), 2);
  int polls = 0;
  absl::StatusOr<TrainResult> r =
      CheckAndRun(trainer, o, Request({}, [&] { return ++polls == 13; }));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->cancelled);
  EXPECT_EQ(r->steps_completed, 1);
  EXPECT_EQ(trainer.global_step(), 1);
  const std::vector<at::Tensor> now = m->Parameters();
  ASSERT_EQ(now.size(), after_first.size());
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_TRUE(torch::equal(now[i], after_first[i])) << i;  // no update, no partial one
    EXPECT_FALSE(now[i].grad().defined()) << i;              // its gradients dropped
  }
  // The run goes on from the abandoned step's windows: the uninterrupted losses.
  absl::StatusOr<std::unique_ptr<TokenDataset>> data = TokenDataset::Create(o.data, 256);
  ASSERT_TRUE(data.ok());
  TrainOptions rest = o;
  rest.steps = 2;
  std::vector<double> resumed;
  ASSERT_TRUE(CheckAndRun(trainer, rest,
                          Request([&](const StepReport& s) { resumed.push_back(s.loss); },
                                  {}, {}, &**data, nullptr, true))
                  .ok());
  EXPECT_EQ(resumed, std::vector<double>(losses.begin() + 1, losses.end()));
}

// One long micro-batch stops between layers, in forward and in backward,
// with nothing updated, no gradient kept and the generator put back.
TEST(TrainerTest, AnInterruptBetweenLayersStopsALongMicroBatch) {
  for (const bool checkpointing : {false, true}) {
    // Three layers: poll 1 at the boundary, 2 and 3 in forward (before layers
    // 1 and 2), 4 in backward (the gradient reaching layer 2's input).
    for (const int at_poll : {2, 4}) {
      SCOPED_TRACE(
          absl::StrCat(checkpointing ? "checkpointing, " : "", "poll ", at_poll));
      LlamaConfig c = SmallLlamaConfig();
      c.num_hidden_layers = 3;
      std::unique_ptr<LlamaModel> m = MakeLlama(c, 5);
      std::vector<at::Tensor> before;
      for (const at::Tensor& p : m->Parameters()) before.push_back(p.detach().clone());
      Trainer trainer(m.get());
      TrainOptions o = SmallOptions(1);
      o.gradient_checkpointing = checkpointing;
      int polls = 0;
      absl::StatusOr<TrainResult> r =
          CheckAndRun(trainer, o, Request({}, [&] { return ++polls == at_poll; }));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->cancelled);
      EXPECT_EQ(r->steps_completed, 0);
      EXPECT_EQ(polls, at_poll);  // nothing polled after the stop
      const std::vector<at::Tensor> now = m->Parameters();
      for (size_t i = 0; i < now.size(); ++i) {
        EXPECT_TRUE(torch::equal(now[i], before[i])) << i;
        EXPECT_FALSE(now[i].grad().defined()) << i;
      }
      // The model trains on afterwards, from the same windows.
      absl::StatusOr<TrainResult> again = CheckAndRun(trainer, o);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(again->steps_completed, 1);
    }
  }
}

TEST(TrainerTest, NewOptionsUpdateTheOptimizer) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  ASSERT_TRUE(CheckAndRun(trainer, SmallOptions(2)).ok());
  std::vector<at::Tensor> before;
  for (const at::Tensor& p : m->Parameters()) before.push_back(p.detach().clone());
  TrainOptions slow = SmallOptions(2);
  slow.learning_rate = 1e-12;
  ASSERT_TRUE(CheckAndRun(trainer, slow).ok());
  double max_change = 0;
  auto params = m->Parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    max_change = std::max(max_change, (params[i] - before[i]).abs().max().item<double>());
  }
  EXPECT_LT(max_change, 1e-9);
  ASSERT_TRUE(CheckAndRun(trainer, SmallOptions(1)).ok());
  double changed = (params[1] - before[1]).abs().max().item<double>();
  EXPECT_GT(changed, 1e-5);
}

TEST(TrainerTest, RunsOnACallersDatasetAndExposesOptimizerState) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  EXPECT_TRUE(trainer.OptimizerState().empty());
  DataSpec spec;
  spec.kind = DataSpec::Kind::kInlineTokens;
  for (int i = 0; i < 300; ++i) spec.tokens.push_back(i % 200);
  absl::StatusOr<std::unique_ptr<TokenDataset>> data = TokenDataset::Create(spec, 256);
  ASSERT_TRUE(data.ok());
  absl::StatusOr<TrainResult> r =
      CheckAndRun(trainer, SmallOptions(2), Request({}, {}, {}, &**data));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->steps_completed, 2);
  // AdamW keeps two moments per parameter.
  std::vector<at::Tensor> state = trainer.OptimizerState();
  EXPECT_EQ(state.size(), 2 * m->Parameters().size());
  TrainOptions bad = SmallOptions(1);
  bad.seq_len = 400;
  EXPECT_EQ(CheckAndRun(trainer, bad, Request({}, {}, {}, &**data)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TrainerTest, BadRequestsAreInvalidArgument) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  TrainOptions o = SmallOptions(1);
  o.seq_len = 65;
  EXPECT_THAT(CheckAndRun(trainer, o).status().message(),
              HasSubstr("max_position_embeddings (64)"));
  o = SmallOptions(0);
  EXPECT_EQ(CheckAndRun(trainer, o).status().code(), absl::StatusCode::kInvalidArgument);
  o = SmallOptions(1);
  o.data.kind = DataSpec::Kind::kTextFile;
  o.data.path = "/no/such/file";
  EXPECT_THAT(CheckAndRun(trainer, o).status().message(), HasSubstr("/no/such/file"));
  o = SmallOptions(1);
  o.data.kind = DataSpec::Kind::kInlineTokens;
  o.data.tokens = std::vector<int64_t>(100, 7);
  o.data.tokens[50] = 256;
  absl::Status s = CheckAndRun(trainer, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("token id 256 at position 50"));
  o.data.tokens = std::vector<int64_t>(20, 7);
  EXPECT_THAT(CheckAndRun(trainer, o).status().message(),
              HasSubstr("fewer than seq_len + 1"));
  EXPECT_EQ(trainer.global_step(), 0);
}

// The sequence length whose [T, T] float attention scores exceed twice this
// machine's RAM + swap, so that Linux's default (heuristic) overcommit
// refuses them outright; 0 when that cannot be relied on.
int64_t UnallocatableSeqLen() {
  std::ifstream overcommit("/proc/sys/vm/overcommit_memory");
  int mode = -1;
  if (!(overcommit >> mode) || mode != 0) return 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0, total = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemTotal:" || key == "SwapTotal:") total += kib * 1024;
  }
  if (total <= 0) return 0;
  int64_t t = 1024;
  while (t * t * 4 <= 2 * total) t *= 2;
  return t;
}

TEST(TrainerTest, OutOfMemoryFailsTheStepAndTrainingContinues) {
  // One long sequence: everything before its attention scores takes a few
  // hundred megabytes at most; the scores cannot be allocated. Eager
  // attention, since SDPA never materialises them.
  const int64_t seq_len = UnallocatableSeqLen();
  if (seq_len == 0 || seq_len > (1 << 20)) {
    GTEST_SKIP() << "needs vm.overcommit_memory=0 and at most ~1 TiB of RAM + swap";
  }
  LlamaConfig c = SmallLlamaConfig();
  c.hidden_size = 8;
  c.intermediate_size = 8;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 1;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = seq_len;
  std::unique_ptr<LlamaModel> m = MakeLlama(c, 5);
  Trainer trainer(m.get());
  std::vector<at::Tensor> before;
  for (const at::Tensor& p : m->Parameters()) before.push_back(p.detach().clone());

  TrainOptions huge = SmallOptions(1);
  huge.batch_size = 1;
  huge.seq_len = seq_len;
  huge.attn_implementation = AttentionImplementation::kEager;
  huge.data.kind = DataSpec::Kind::kInlineTokens;
  huge.data.tokens.resize(seq_len + 1);
  for (size_t i = 0; i < huge.data.tokens.size(); ++i) huge.data.tokens[i] = i % 251;
  absl::StatusOr<TrainResult> r = CheckAndRun(trainer, huge);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("out of memory"));
  auto params = m->Parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_FALSE(params[i].grad().defined());
    EXPECT_TRUE(torch::equal(params[i], before[i]));
  }
  EXPECT_EQ(trainer.global_step(), 0);

  r = CheckAndRun(trainer, SmallOptions(2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 2);
  EXPECT_TRUE(std::isfinite(r->last_loss));
}

}  // namespace
}  // namespace memprofd

namespace memprofd {
namespace {

TrainOptions LoraOptionsOf(int64_t steps, bool checkpointing) {
  TrainOptions o = SmallOptions(steps);
  o.learning_rate = 1e-2;
  o.gradient_checkpointing = checkpointing;
  o.lora.r = 4;
  o.lora.alpha = 8;
  o.lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  return o;
}

TEST(TrainerLoraTest, ARunWithLoraTrainsTheAdaptersAloneCheckpointedOrNot) {
  std::vector<double> losses[2];
  std::vector<at::Tensor> adapters[2];
  for (int checkpointing = 0; checkpointing < 2; ++checkpointing) {
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
    std::vector<at::Tensor> before;
    for (const at::Tensor& p : m->Parameters()) before.push_back(p.detach().clone());
    Trainer trainer(m.get());
    absl::StatusOr<TrainResult> r = CheckAndRun(
        trainer, LoraOptionsOf(4, checkpointing != 0),
        Request([&](const StepReport& s) { losses[checkpointing].push_back(s.loss); }));
    ASSERT_TRUE(r.ok()) << r.status();
    // The base is as it was, bit for bit; B has moved off zero.
    const auto base = m->NamedBaseParameters();
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(torch::equal(base[i].second, before[i])) << base[i].first;
    }
    for (const auto& [name, t] : m->NamedAdapters()) {
      adapters[checkpointing].push_back(t.detach().clone());
      if (name.find("lora_B") != std::string::npos) {
        EXPECT_GT(t.abs().max().item<double>(), 0) << name;
      }
    }
    // AdamW keeps state for the adapters only.
    for (const auto& [name, t] : trainer.NamedOptimizerState()) {
      EXPECT_NE(name.find(".lora_"), std::string::npos) << name;
    }
    EXPECT_EQ(trainer.NamedOptimizerState().size(), 3 * m->NamedAdapters().size());
  }
  // Checkpointing recomputes the layers: the same losses and adapters.
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_NE(losses[0].front(), losses[0].back());
  ASSERT_EQ(adapters[0].size(), adapters[1].size());
  for (size_t i = 0; i < adapters[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(adapters[0][i], adapters[1][i]));
  }
}

// lora_dropout draws its masks from the run's seed, the step and the
// micro-batch: a checkpointed layer's recompute draws the forward's masks (the
// same losses and adapters, bit for bit), a rerun draws the same, and an
// evaluation draws none.
TEST(TrainerLoraTest, DropoutMasksAreTheStepsOwnEvenWhenRecomputed) {
  struct Run {
    std::vector<double> losses;
    std::vector<at::Tensor> adapters;
    double eval_loss = 0;
    double eval_again = 0;
  };
  auto run = [](bool checkpointing, double dropout) {
    Run out;
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
    Trainer trainer(m.get());
    TrainOptions o = LoraOptionsOf(4, checkpointing);
    o.lora.dropout = dropout;
    o.grad_accumulation_steps = 2;
    absl::StatusOr<TrainResult> r = CheckAndRun(
        trainer, o, Request([&](const StepReport& s) { out.losses.push_back(s.loss); }));
    EXPECT_TRUE(r.ok()) << r.status();
    for (const auto& [name, t] : m->NamedAdapters()) {
      out.adapters.push_back(t.detach().clone());
    }
    absl::StatusOr<std::unique_ptr<TokenDataset>> data =
        TokenDataset::Create(o.data, 256);
    EXPECT_TRUE(data.ok()) << data.status();
    if (!data.ok()) return out;
    EvalOptions eval;
    eval.batch_size = 2;
    eval.seq_len = 16;
    eval.max_batches = 2;
    absl::StatusOr<EvalResult> e = EvaluateModel(*m, **data, eval);
    EXPECT_TRUE(e.ok()) << e.status();
    out.eval_loss = e.ok() ? e->loss : 0;
    e = EvaluateModel(*m, **data, eval);
    out.eval_again = e.ok() ? e->loss : 0;
    return out;
  };
  const Run plain = run(false, 0.3);
  const Run recomputed = run(true, 0.3);
  const Run again = run(false, 0.3);
  const Run without = run(false, 0.0);
  EXPECT_EQ(plain.losses, recomputed.losses);
  EXPECT_EQ(plain.losses, again.losses);
  // Step 1 is the same (B starts at zero, so no adapter changes the loss
  // yet); after it, dropout changes what the adapters learn.
  ASSERT_EQ(plain.losses.size(), 4u);
  EXPECT_EQ(plain.losses[0], without.losses[0]);
  EXPECT_NE(plain.losses[3], without.losses[3]);
  for (size_t i = 0; i < plain.adapters.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain.adapters[i], recomputed.adapters[i])) << i;
    EXPECT_TRUE(torch::equal(plain.adapters[i], again.adapters[i])) << i;
  }
  // No mask in an evaluation: the same loss every time.
  EXPECT_EQ(plain.eval_loss, plain.eval_again);
}

TEST(TrainerLoraTest, LaterRunsTrainTheSameAdaptersAndRefuseOthers) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  ASSERT_TRUE(CheckAndRun(trainer, LoraOptionsOf(1, false)).ok());
  const at::Tensor b = m->NamedAdapters()[1].second.detach().clone();
  // Without lora fields: the model's adapters train on.
  absl::StatusOr<TrainResult> again = CheckAndRun(trainer, SmallOptions(1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(torch::equal(m->NamedAdapters()[1].second, b));
  TrainOptions other = LoraOptionsOf(1, false);
  other.lora.r = 8;
  absl::Status refused = CheckAndRun(trainer, other).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("has LoRA adapters (r 4"));

  // A model whose every parameter has trained takes no adapters.
  std::unique_ptr<LlamaModel> full = MakeLlama(SmallLlamaConfig(), 5);
  Trainer full_trainer(full.get());
  ASSERT_TRUE(CheckAndRun(full_trainer, SmallOptions(1)).ok());
  refused = CheckAndRun(full_trainer, LoraOptionsOf(1, false)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_FALSE(full->lora().has_value());
}

}  // namespace
}  // namespace memprofd

namespace memprofd {
namespace {

// The weights autograd saves for the inputs' gradients of every adapted
// projection are frozen parameters: the offloader recognises them and copies
// none, and offloading the rest changes no bit of the run.
TEST(TrainerLoraTest, TheOffloaderSkipsTheFrozenWeightsAndChangesNothing) {
  std::vector<double> losses[2];
  std::vector<at::Tensor> adapters[2];
  offload::OffloadStats stats;
  for (int offloaded = 0; offloaded < 2; ++offloaded) {
    std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
    Trainer trainer(m.get());
    std::unique_ptr<offload::Offloader> offloader =
        offload::testing::MakeOffloader(offload::Target::kDisk, 0);
    ASSERT_NE(offloader, nullptr);
    offload::OffloadStepListener listener(offloader.get(), m.get());
    TrainRunRequest request;
    request.on_step = [&](const StepReport& s) { losses[offloaded].push_back(s.loss); };
    if (offloaded != 0) request.listeners = {&listener};
    TrainOptions o = LoraOptionsOf(3, false);
    o.lora.target_modules = {"all-linear"};
    ASSERT_TRUE(CheckAndRun(trainer, o, request).ok());
    for (const auto& [name, t] : m->NamedAdapters()) {
      adapters[offloaded].push_back(t.detach().clone());
    }
    if (offloaded != 0) stats = listener.last_step();
  }
  EXPECT_EQ(losses[0], losses[1]);
  for (size_t i = 0; i < adapters[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(adapters[0][i], adapters[1][i]));
  }
  std::cout << "last step: " << stats.skipped_of(offload::SkipReason::kParameter)
            << " parameters left in place, " << stats.tensors_offloaded
            << " tensors offloaded, " << stats.bytes_out << " bytes out\n";
  // Seven frozen projection weights per layer reach the offloader each step
  // (more when autograd saves one twice) and are left where they are.
  EXPECT_GE(stats.skipped_of(offload::SkipReason::kParameter),
            7 * SmallLlamaConfig().num_hidden_layers);
  EXPECT_GT(stats.tensors_offloaded, 0);
}

}  // namespace
}  // namespace memprofd

namespace memprofd {
namespace {

// The base's weights rounded to bf16 in place (still float32).
void RoundBaseToBf16(LlamaModel& m) {
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : m.NamedBaseParameters()) t.copy_(t.to(at::kBFloat16));
}

// base_dtype bf16 keeps the frozen base in bf16 and computes, under bf16
// autocast, exactly as the float32 base rounded to bf16 does: the same
// losses, adapters and evaluation, bit for bit, on every family's shape
// (Qwen3's per-head norms, Qwen2's biases, a tied and an untied head).
TEST(TrainerLoraTest, ABf16BaseTrainsAsTheFloat32BaseRoundedToBf16) {
  for (const LlamaConfig& config :
       {SmallLlamaConfig(), testing::AsQwen3(SmallLlamaConfig()),
        testing::AsWindowedQwen2(SmallLlamaConfig())}) {
    SCOPED_TRACE(config.model_type);
    struct Run {
      std::vector<double> losses;
      std::vector<at::Tensor> adapters;
      double eval = 0;
    };
    auto run = [&config](BaseDtype dtype, std::unique_ptr<LlamaModel>* kept) {
      Run out;
      std::unique_ptr<LlamaModel> m = MakeLlama(config, 5);
      if (dtype == BaseDtype::kFloat32) RoundBaseToBf16(*m);
      TrainOptions o = LoraOptionsOf(3, /*checkpointing=*/true);
      o.lora.target_modules = {"all-linear"};
      o.mixed_precision = MixedPrecision::kBf16;
      o.base_dtype = dtype;
      {
        Trainer trainer(m.get());
        EXPECT_TRUE(CheckAndRun(trainer, o, Request([&](const StepReport& s) {
                                  out.losses.push_back(s.loss);
                                }))
                        .ok());
      }
      for (const auto& [name, t] : m->NamedAdapters()) {
        out.adapters.push_back(t.detach().clone());
      }
      absl::StatusOr<std::unique_ptr<TokenDataset>> data =
          TokenDataset::Create(o.data, config.vocab_size);
      EXPECT_TRUE(data.ok()) << data.status();
      EvalOptions eval;
      eval.batch_size = 2;
      eval.seq_len = 16;
      eval.max_batches = 2;
      eval.mixed_precision = MixedPrecision::kBf16;
      absl::StatusOr<EvalResult> e = EvaluateModel(*m, **data, eval);
      EXPECT_TRUE(e.ok()) << e.status();
      out.eval = e.ok() ? e->loss : 0;
      *kept = std::move(m);
      return out;
    };
    std::unique_ptr<LlamaModel> rounded, bf16;
    const Run a = run(BaseDtype::kFloat32, &rounded);
    const Run b = run(BaseDtype::kBf16, &bf16);
    ASSERT_EQ(a.losses.size(), 3u);
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_NE(a.losses.front(), a.losses.back());
    EXPECT_EQ(a.eval, b.eval);
    ASSERT_EQ(a.adapters.size(), b.adapters.size());
    for (size_t i = 0; i < a.adapters.size(); ++i) {
      EXPECT_EQ(b.adapters[i].scalar_type(), at::kFloat);
      EXPECT_TRUE(torch::equal(a.adapters[i], b.adapters[i])) << i;
    }
    // The bf16 base holds the rounded values in half the bytes.
    EXPECT_EQ(bf16->base_dtype(), at::kBFloat16);
    const auto base_a = rounded->NamedBaseParameters();
    const auto base_b = bf16->NamedBaseParameters();
    int64_t bytes_a = 0, bytes_b = 0;
    for (size_t i = 0; i < base_a.size(); ++i) {
      ASSERT_EQ(base_b[i].second.scalar_type(), at::kBFloat16) << base_b[i].first;
      EXPECT_FALSE(base_b[i].second.requires_grad()) << base_b[i].first;
      EXPECT_TRUE(torch::equal(base_a[i].second, base_b[i].second.to(at::kFloat)))
          << base_b[i].first;
      bytes_a += base_a[i].second.nbytes();
      bytes_b += base_b[i].second.nbytes();
    }
    EXPECT_EQ(2 * bytes_b, bytes_a);
    EXPECT_EQ(rounded->BaseFingerprint(), bf16->BaseFingerprint());
  }
}

// A model made in bf16 (LoadModel's base_dtype) trains as the float32 model
// cast when its run starts, bit for bit, and takes no full fine-tune.
TEST(TrainerLoraTest, AModelMadeInBf16TrainsAsOneCastAtItsRunsStart) {
  TrainOptions o = LoraOptionsOf(3, /*checkpointing=*/true);
  o.mixed_precision = MixedPrecision::kBf16;
  o.base_dtype = BaseDtype::kBf16;
  std::vector<double> losses[2];
  std::vector<at::Tensor> adapters[2];
  for (int made_bf16 = 0; made_bf16 < 2; ++made_bf16) {
    absl::StatusOr<std::unique_ptr<LlamaModel>> m =
        LlamaModel::Create(SmallLlamaConfig(), 5, c10::Device(c10::DeviceType::CPU),
                           made_bf16 != 0 ? at::kBFloat16 : at::kFloat);
    ASSERT_TRUE(m.ok()) << m.status();
    Trainer trainer(m->get());
    if (made_bf16 != 0) {
      TrainOptions full = SmallOptions(1);
      full.mixed_precision = MixedPrecision::kBf16;
      absl::Status refused = CheckAndRun(trainer, full).status();
      EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
      EXPECT_THAT(refused.message(), HasSubstr("trains LoRA adapters only"));
    }
    ASSERT_TRUE(CheckAndRun(trainer, o, Request([&](const StepReport& s) {
                              losses[made_bf16].push_back(s.loss);
                            }))
                    .ok());
    for (const auto& [name, t] : (*m)->NamedAdapters()) {
      adapters[made_bf16].push_back(t.detach().clone());
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
  ASSERT_EQ(adapters[0].size(), adapters[1].size());
  for (size_t i = 0; i < adapters[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(adapters[0][i], adapters[1][i])) << i;
  }
}

TEST(TrainerLoraTest, ABf16BaseNeedsAdaptersAndAutocastAndStaysBf16) {
  TrainOptions o = LoraOptionsOf(1, false);
  o.base_dtype = BaseDtype::kBf16;
  // Without autocast a bf16 base cannot compute.
  absl::Status refused = ValidTrainOptions::Check(o, 64).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("base_dtype bf16 needs mixed_precision bf16"));
  o.mixed_precision = MixedPrecision::kBf16;

  std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(m.get());
  // A full fine-tune keeps every weight float32.
  TrainOptions full = SmallOptions(1);
  full.mixed_precision = MixedPrecision::kBf16;
  full.base_dtype = BaseDtype::kBf16;
  refused = CheckAndRun(trainer, full).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("give lora_r"));
  EXPECT_EQ(m->base_dtype(), at::kFloat);
  EXPECT_FALSE(m->lora().has_value());

  ASSERT_TRUE(CheckAndRun(trainer, o).ok());
  EXPECT_EQ(m->base_dtype(), at::kBFloat16);
  // A later run trains the adapters on the bf16 base, without lora fields;
  // a float32 base cannot come back.
  full.base_dtype = BaseDtype::kFloat32;
  refused = CheckAndRun(trainer, full).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("cannot be undone"));
  full.base_dtype = BaseDtype::kBf16;
  absl::StatusOr<TrainResult> again = CheckAndRun(trainer, full);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->global_step, 2);

  // Evaluating needs the autocast the base computes under.
  absl::StatusOr<std::unique_ptr<TokenDataset>> data = TokenDataset::Create(o.data, 256);
  ASSERT_TRUE(data.ok()) << data.status();
  EvalOptions eval;
  eval.batch_size = 2;
  eval.seq_len = 16;
  eval.max_batches = 1;
  refused = EvaluateModel(*m, **data, eval).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("evaluate with mixed_precision bf16"));
  eval.mixed_precision = MixedPrecision::kBf16;
  EXPECT_TRUE(EvaluateModel(*m, **data, eval).ok());
}

}  // namespace
}  // namespace memprofd
