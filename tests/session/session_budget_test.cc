// Training under a byte budget through the one door (StartTraining with
// memory_budget_bytes): the checks at once, the choice made on the plan
// thread, a run whose measured step peaks stay under the budget, and a
// refusal that allocates nothing; and every run's calibration against its
// plan.

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
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

TrainSpec SmallRun() {
  TrainSpec spec;
  spec.train.steps = 3;
  spec.train.batch_size = 8;
  spec.train.seq_len = 64;
  return spec;
}

// The plan of `spec`'s configuration, unconstrained, on the loaded model.
plan::MemoryPlan PlanOf(Session& session, const TrainSpec& spec) {
  PlanMemorySpec ask;
  ask.train = spec;
  absl::StatusOr<std::shared_ptr<Operation>> op = session.StartPlan(ask);
  EXPECT_TRUE(op.ok()) << op.status();
  if (!op.ok()) return {};
  const OperationView v = WaitDone(**op);
  EXPECT_EQ(v.state, OperationState::kSucceeded) << v.error;
  if (v.state != OperationState::kSucceeded) return {};
  return std::get<PlanResult>(v.result).plan;
}

int64_t CpuCurrentBytes(const Session& session) {
  return session.MemoryStats().devices.at(0).current_bytes;
}

TEST(SessionBudgetTest, BadBudgetsAreRefusedAtOnce) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  TrainSpec spec = SmallRun();
  spec.memory_budget_bytes = 0;
  absl::Status s = session->StartTraining(spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("memory_budget_bytes"));
  spec.memory_budget_bytes = -5;
  EXPECT_EQ(session->StartTraining(spec).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec.memory_budget_bytes = int64_t{1} << 40;
  spec.resume = true;
  s = session->StartTraining(spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(s.message(), HasSubstr("resume"));
  EXPECT_TRUE(session->ListOperations(OperationKind::kTrain, false).empty());
}

TEST(SessionBudgetTest, HalfwayBudgetTrainsUnderIt) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  const plan::MemoryPlan unconstrained = PlanOf(*session, SmallRun());
  ASSERT_GT(unconstrained.peak_allocated_bytes, unconstrained.model_state_bytes);
  const int64_t budget =
      (unconstrained.model_state_bytes + unconstrained.peak_allocated_bytes) / 2;

  TrainSpec spec = SmallRun();
  spec.memory_budget_bytes = budget;
  absl::StatusOr<std::shared_ptr<Operation>> op = session->StartTraining(spec);
  ASSERT_TRUE(op.ok()) << op.status();
  // The run holds the training's place while it is planned.
  EXPECT_EQ(session->StartTraining(SmallRun()).status().code(),
            absl::StatusCode::kAborted);
  const OperationView v = WaitDone(**op);
  ASSERT_EQ(v.state, OperationState::kSucceeded) << v.error;
  const auto& result = std::get<TrainResult>(v.result);
  EXPECT_EQ(result.steps_completed, 3);
  EXPECT_FALSE(result.budget_choice.empty());
  EXPECT_GT(result.planned_peak_bytes, 0);
  EXPECT_LE(result.planned_peak_bytes, budget);

  int64_t first = 0;
  const std::vector<SessionStepReport> steps = (*op)->EventsFrom(1, 100, &first);
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].budget_choice, result.budget_choice);
  EXPECT_TRUE(steps[1].budget_choice.empty());
  for (const SessionStepReport& r : steps) {
    EXPECT_EQ(r.planned_peak_bytes, result.planned_peak_bytes);
    EXPECT_GT(r.peak_allocated_bytes, 0);
    EXPECT_LE(r.peak_allocated_bytes, budget)
        << "step " << r.step.step << " under " << result.budget_choice;
  }
}

TEST(SessionBudgetTest, BudgetBelowTheModelStateIsRefusedBeforeAllocating) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  const plan::MemoryPlan unconstrained = PlanOf(*session, SmallRun());
  ASSERT_GT(unconstrained.model_state_bytes, 0);
  const int64_t before = CpuCurrentBytes(*session);

  TrainSpec spec = SmallRun();
  spec.memory_budget_bytes = unconstrained.model_state_bytes / 2;
  absl::StatusOr<std::shared_ptr<Operation>> op = session->StartTraining(spec);
  ASSERT_TRUE(op.ok()) << op.status();
  const OperationView v = WaitDone(**op);
  EXPECT_EQ(v.state, OperationState::kFailed);
  EXPECT_EQ(v.error.code(), absl::StatusCode::kResourceExhausted) << v.error;
  EXPECT_EQ((*op)->events_total(), 0);
  // The request's data (the embedded corpus, read at once as for any Train)
  // goes with the plan thread's work item, just after the operation ends.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (CpuCurrentBytes(*session) != before && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(CpuCurrentBytes(*session), before);
  EXPECT_EQ(session->Model()->steps_trained, 0);
  // The place is free again: a training without a budget runs.
  absl::StatusOr<std::shared_ptr<Operation>> next = session->StartTraining(SmallRun());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(WaitDone(**next).state, OperationState::kSucceeded);
}

TEST(SessionBudgetTest, EveryRunIsCalibratedAgainstItsPlanBesideIt) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  EXPECT_FALSE(session->Counters().plan_error_ratio.has_value());
  TrainSpec spec = SmallRun();
  spec.train.steps = 100000;
  absl::StatusOr<std::shared_ptr<Operation>> op = session->StartTraining(spec);
  ASSERT_TRUE(op.ok()) << op.status();
  // The run starts once its plan is made; its reports carry it.
  int64_t planned = 0;
  testing::WaitFor(
      **op,
      [&](const OperationView& v) {
        if (v.completed < 2) return false;
        int64_t first = 0;
        const std::vector<SessionStepReport> last =
            (*op)->EventsFrom(v.completed, 1, &first);
        planned = last.empty() ? 0 : last.back().planned_peak_bytes;
        return planned > 0;
      },
      absl::Minutes(2));
  ASSERT_GT(planned, 0);
  const int64_t steps_then = (*op)->View().completed;
  testing::WaitFor(
      **op, [&](const OperationView& v) { return v.completed >= steps_then + 2; },
      absl::Minutes(2));
  ASSERT_TRUE(session->CancelOperation((*op)->id()).ok());
  const OperationView v = WaitDone(**op);
  EXPECT_EQ(v.state, OperationState::kCancelled);
  EXPECT_EQ(std::get<TrainResult>(v.result).planned_peak_bytes, planned);
  EXPECT_TRUE(std::get<TrainResult>(v.result).budget_choice.empty());
  const std::optional<double> error = session->Counters().plan_error_ratio;
  ASSERT_TRUE(error.has_value());
  EXPECT_LT(std::abs(*error), 0.05) << "planned " << planned;
}

}  // namespace
}  // namespace memprofd
