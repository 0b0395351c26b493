// Evaluation through the one door (StartEvaluation: the checks, queued at a
// step boundary, the counters) and bf16 training with the offloader and
// gradient checkpointing on the session's real step hooks.

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/session/session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/operation.h"
#include "tests/testing/session.h"

namespace memprofd {
namespace {

using ::memprofd::testing::CpuSession;
using ::memprofd::testing::WaitDone;
using ::testing::HasSubstr;

EvalSpec SmallEval() {
  EvalSpec r;
  r.batch_size = 2;
  r.seq_len = 32;
  r.max_batches = 2;
  return r;
}

EvalResult Evaluated(Session& session, const EvalSpec& request) {
  absl::StatusOr<std::shared_ptr<Operation>> op = session.StartEvaluation(request);
  EXPECT_TRUE(op.ok()) << op.status();
  if (!op.ok()) return {};
  const OperationView v = WaitDone(**op);
  EXPECT_EQ(v.kind, OperationKind::kEvaluate);
  EXPECT_EQ(v.state, OperationState::kSucceeded) << v.error;
  const EvalResult* r = std::get_if<EvalResult>(&v.result);
  return r ? *r : EvalResult{};
}

TEST(SessionEvalTest, WithoutAModelEvaluateSaysLoadFirst) {
  std::unique_ptr<Session> session = CpuSession("");
  ASSERT_NE(session, nullptr);
  absl::Status s = session->StartEvaluation(SmallEval()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("LoadModel"));
}

TEST(SessionEvalTest, BadRequestsAreInvalidArgumentAndQueueNothing) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  EvalSpec r = SmallEval();
  r.seq_len = 0;
  EXPECT_THAT(session->StartEvaluation(r).status().message(), HasSubstr("seq_len"));
  r.seq_len = 100000;
  EXPECT_THAT(session->StartEvaluation(r).status().message(),
              HasSubstr("max_position_embeddings"));
  r = SmallEval();
  r.max_batches = -1;
  EXPECT_THAT(session->StartEvaluation(r).status().message(), HasSubstr("max_batches"));
  r = SmallEval();
  r.mixed_precision = "fp8";
  EXPECT_THAT(session->StartEvaluation(r).status().message(), HasSubstr("bf16"));
  r = SmallEval();
  r.data.kind = DataSpec::Kind::kInlineTokens;
  r.data.tokens = std::vector<int64_t>(20, 3);
  absl::Status s = session->StartEvaluation(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("fewer than seq_len + 1"));
  EXPECT_EQ(session->ListOperations(OperationKind::kEvaluate, false).size(), 0u);
}

TEST(SessionEvalTest, AFileIsReadInTheOperationAndBadOnesFailIt) {
  // A file is read on the owner thread, not the caller's: the call answers
  // at once, and the operation carries what is wrong with the file.
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  EvalSpec r = SmallEval();
  // A file outside the data roots (CpuSession sets none).
  r.data.kind = DataSpec::Kind::kTextFile;
  r.data.path = "/etc/passwd";
  absl::StatusOr<std::shared_ptr<Operation>> op = session->StartEvaluation(r);
  ASSERT_TRUE(op.ok()) << op.status();
  OperationView v = WaitDone(**op);
  EXPECT_EQ(v.state, OperationState::kFailed);
  EXPECT_EQ(v.error.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(v.error.message(), HasSubstr("outside the daemon's data roots"));
  // The model still evaluates.
  EXPECT_GT(Evaluated(*session, SmallEval()).tokens, 0);
}

TEST(SessionEvalTest, EvaluationsAreDeterministicCountedAndSeeTraining) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  const EvalResult before = Evaluated(*session, SmallEval());
  EXPECT_EQ(before.tokens, 2 * 2 * 32);
  EXPECT_EQ(before.global_step, 0);
  EXPECT_EQ(Evaluated(*session, SmallEval()).loss, before.loss);

  TrainSpec spec;
  spec.train.steps = 6;
  spec.train.batch_size = 2;
  spec.train.seq_len = 32;
  spec.train.learning_rate = 3e-3;
  spec.train.lr_scheduler_type = "cosine";
  spec.train.warmup_steps = 2;
  spec.train.eval_every_steps = 3;
  spec.train.eval_data = DataSpec();
  spec.train.eval_max_batches = 2;
  absl::StatusOr<std::shared_ptr<Operation>> op = session->StartTraining(spec);
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_EQ(WaitDone(**op).state, OperationState::kSucceeded);
  int64_t first = 0;
  std::vector<SessionStepReport> steps = (*op)->EventsFrom(1, 100, &first);
  ASSERT_EQ(steps.size(), 6u);
  EXPECT_EQ(steps[0].step.learning_rate, 0.0);
  EXPECT_EQ(steps[1].step.learning_rate, 1.5e-3);
  EXPECT_EQ(steps[2].step.learning_rate, 3e-3);
  std::vector<int64_t> evaluated;
  for (const SessionStepReport& r : steps) {
    if (r.step.eval) evaluated.push_back(r.step.step);
  }
  EXPECT_THAT(evaluated, ::testing::ElementsAre(3, 6));
  // The evaluation after the last step and one asked for now see the same
  // weights, with the same windows: the same loss, bit for bit.
  const EvalResult after = Evaluated(*session, SmallEval());
  EXPECT_EQ(after.loss, steps[5].step.eval->loss);
  EXPECT_EQ(after.global_step, 6);
  EXPECT_LT(after.loss, before.loss);
  const SessionCounters c = session->Counters();
  EXPECT_EQ(c.evaluations_total, 5);
  ASSERT_TRUE(c.last_eval.has_value());
  EXPECT_EQ(c.last_eval->loss, after.loss);
}

TEST(SessionEvalTest, AnEvaluationAskedForDuringTrainingRunsBetweenTwoSteps) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  TrainSpec spec;
  spec.train.steps = 100000;
  spec.train.batch_size = 1;
  spec.train.seq_len = 16;
  absl::StatusOr<std::shared_ptr<Operation>> train = session->StartTraining(spec);
  ASSERT_TRUE(train.ok()) << train.status();
  testing::WaitFor(
      **train, [](const OperationView& v) { return v.completed >= 2; }, absl::Minutes(2));
  const EvalResult during = Evaluated(*session, SmallEval());
  // Training was neither stopped nor finished: the evaluation saw the model
  // after some step, and training goes on after it.
  EXPECT_GE(during.global_step, 2);
  const int64_t steps_then = (*train)->events_total();
  testing::WaitFor(
      **train, [&](const OperationView& v) { return v.completed > steps_then; },
      absl::Minutes(2));
  EXPECT_FALSE((*train)->done());
  ASSERT_TRUE(session->CancelOperation((*train)->id()).ok());
  EXPECT_EQ(WaitDone(**train).state, OperationState::kCancelled);
}

std::vector<double> TrainBf16(bool offload_and_checkpointing,
                              offload::OffloadStats* offloaded) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  if (session == nullptr) return {};
  TrainSpec spec;
  spec.train.steps = 3;
  spec.train.batch_size = 2;
  spec.train.seq_len = 32;
  spec.train.mixed_precision = "bf16";
  spec.train.gradient_checkpointing = offload_and_checkpointing;
  spec.offload.enabled = offload_and_checkpointing;
  spec.offload.target = offload::Target::kDisk;
  spec.offload.min_offload_bytes = 0;
  absl::StatusOr<std::shared_ptr<Operation>> op = session->StartTraining(spec);
  EXPECT_TRUE(op.ok()) << op.status();
  if (!op.ok()) return {};
  const OperationView v = WaitDone(**op);
  EXPECT_EQ(v.state, OperationState::kSucceeded) << v.error;
  int64_t first = 0;
  std::vector<double> losses;
  for (const SessionStepReport& r : (*op)->EventsFrom(1, 100, &first)) {
    losses.push_back(r.step.loss);
    offloaded->Add(r.offload);
  }
  return losses;
}

TEST(SessionEvalTest, Bf16StepsWithOffloadingAndCheckpointingEqualPlainBf16) {
  offload::OffloadStats plain_stats, offload_stats;
  const std::vector<double> plain = TrainBf16(false, &plain_stats);
  const std::vector<double> offloaded = TrainBf16(true, &offload_stats);
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(plain, offloaded);
  EXPECT_EQ(plain_stats.bytes_out, 0);
  // The checkpointed layers' inputs went to disk and came back.
  EXPECT_GT(offload_stats.bytes_out, 0);
  EXPECT_EQ(offload_stats.bytes_in, offload_stats.bytes_out);
}

}  // namespace
}  // namespace memprofd
