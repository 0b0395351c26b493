// Memory plans through the one door (StartPlan): the checks at once, the
// plan thread beside a training, one plan at a time, and what fails the
// operation instead (a directory outside the roots, what the planner cannot
// plan yet).

#include <memory>
#include <string>
#include <variant>

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

PlanMemorySpec SmallPlan() {
  PlanMemorySpec spec;
  spec.train.train.batch_size = 2;
  spec.train.train.seq_len = 32;
  return spec;
}

TEST(SessionPlanTest, PlansTheLoadedModelWithAVerdict) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  PlanMemorySpec spec = SmallPlan();
  spec.capacity_bytes = int64_t{1} << 40;
  absl::StatusOr<std::shared_ptr<Operation>> op = session->StartPlan(spec);
  ASSERT_TRUE(op.ok()) << op.status();
  const OperationView v = WaitDone(**op);
  EXPECT_EQ(v.kind, OperationKind::kPlan);
  ASSERT_EQ(v.state, OperationState::kSucceeded) << v.error;
  const auto& r = std::get<PlanResult>(v.result);
  EXPECT_EQ(r.model, "preset:tiny");
  EXPECT_EQ(r.target, plan::PlanSpec::Target::kCpu);
  const plan::MemoryPlan& p = r.plan;
  EXPECT_GT(p.peak_allocated_bytes, p.model_state_bytes);
  // Parameters, their gradients and AdamW's two moments at the least.
  EXPECT_GE(p.model_state_bytes, 3 * 4'000'000 * 4);
  int64_t sum = 0;
  for (int64_t bytes : p.categories_at_peak) sum += bytes;
  EXPECT_EQ(sum, p.peak_allocated_bytes);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.headroom_bytes, (int64_t{1} << 40) - p.peak_allocated_bytes);
}

TEST(SessionPlanTest, BadRequestsAreRefusedAtOnceAndQueueNothing) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  auto refused = [&](const PlanMemorySpec& spec) {
    absl::Status s = session->StartPlan(spec).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  PlanMemorySpec spec = SmallPlan();
  spec.target = "tpu";
  EXPECT_THAT(refused(spec), HasSubstr("cpu or cuda"));
  spec = SmallPlan();
  spec.capacity_bytes = -1;
  EXPECT_THAT(refused(spec), HasSubstr("capacity_bytes"));
  spec = SmallPlan();
  spec.train.train.batch_size = 0;
  EXPECT_THAT(refused(spec), HasSubstr("batch_size"));
  spec = SmallPlan();
  spec.train.train.seq_len = 100000;
  EXPECT_THAT(refused(spec), HasSubstr("max_position_embeddings"));
  spec = SmallPlan();
  spec.train.resume = true;
  EXPECT_THAT(refused(spec), HasSubstr("resume"));
  spec = SmallPlan();
  spec.preset = "huge";
  EXPECT_THAT(refused(spec), HasSubstr("tiny"));
  spec = SmallPlan();
  spec.preset = "small";
  spec.hf_config_dir = "/models/small";
  EXPECT_THAT(refused(spec), HasSubstr("at most one"));
  EXPECT_EQ(session->ListOperations(OperationKind::kPlan, false).size(), 0u);
}

TEST(SessionPlanTest, WithoutAModelOnlyANamedOneIsPlanned) {
  std::unique_ptr<Session> session = CpuSession("");
  ASSERT_NE(session, nullptr);
  absl::Status s = session->StartPlan(SmallPlan()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("preset"));
  PlanMemorySpec spec = SmallPlan();
  spec.preset = "tiny";
  spec.target = "cuda";  // planned for a device this host lacks
  absl::StatusOr<std::shared_ptr<Operation>> op = session->StartPlan(spec);
  ASSERT_TRUE(op.ok()) << op.status();
  const OperationView v = WaitDone(**op);
  ASSERT_EQ(v.state, OperationState::kSucceeded) << v.error;
  EXPECT_EQ(std::get<PlanResult>(v.result).target, plan::PlanSpec::Target::kCuda);
  // Each block as the caching allocator hands it out: multiples of 512.
  EXPECT_EQ(std::get<PlanResult>(v.result).plan.peak_allocated_bytes % 512, 0);
}

TEST(SessionPlanTest, WhatIsFoundWhileRunningFailsTheOperation) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  // CpuSession sets no data roots: no client-named directory may be read.
  PlanMemorySpec spec = SmallPlan();
  spec.hf_config_dir = "/tmp";
  absl::StatusOr<std::shared_ptr<Operation>> op = session->StartPlan(spec);
  ASSERT_TRUE(op.ok()) << op.status();
  OperationView v = WaitDone(**op);
  EXPECT_EQ(v.state, OperationState::kFailed);
  EXPECT_EQ(v.error.code(), absl::StatusCode::kPermissionDenied) << v.error;
  EXPECT_THAT(v.error.message(), HasSubstr("hf_config_dir"));

  // The session serves on: bf16 for a cuda target plans (CUDA's autocast).
  spec = SmallPlan();
  spec.train.train.mixed_precision = "bf16";
  spec.target = "cuda";
  op = session->StartPlan(spec);
  ASSERT_TRUE(op.ok()) << op.status();
  v = WaitDone(**op);
  EXPECT_EQ(v.state, OperationState::kSucceeded) << v.error;
}

TEST(SessionPlanTest, OnePlanAtATimeBesideATrainingThatGoesOn) {
  std::unique_ptr<Session> session = CpuSession("tiny");
  ASSERT_NE(session, nullptr);
  TrainSpec train;
  train.train.steps = 100000;
  train.train.batch_size = 2;
  train.train.seq_len = 32;
  absl::StatusOr<std::shared_ptr<Operation>> training = session->StartTraining(train);
  ASSERT_TRUE(training.ok()) << training.status();
  testing::WaitFor(
      **training, [](const OperationView& v) { return v.completed >= 1; },
      absl::Minutes(2));

  // Eight micro-batches of the small preset a step: a plan that lasts far
  // longer than the next call takes.
  PlanMemorySpec spec;
  spec.preset = "small";
  spec.train.train.grad_accumulation_steps = 8;
  absl::StatusOr<std::shared_ptr<Operation>> first = session->StartPlan(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::Status second = session->StartPlan(SmallPlan()).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_THAT(second.message(), HasSubstr((*first)->id()));

  const OperationView planned = WaitDone(**first);
  ASSERT_EQ(planned.state, OperationState::kSucceeded) << planned.error;
  // The training neither waited for the plan nor stopped for it.
  const int64_t steps_then = (*training)->View().completed;
  EXPECT_FALSE((*training)->done());
  testing::WaitFor(
      **training,
      [steps_then](const OperationView& v) { return v.completed >= steps_then + 2; },
      absl::Minutes(2));
  EXPECT_FALSE((*training)->done());
  // The next plan may start once the first is done.
  absl::StatusOr<std::shared_ptr<Operation>> next = session->StartPlan(SmallPlan());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(WaitDone(**next).state, OperationState::kSucceeded);
  ASSERT_TRUE(session->CancelOperation((*training)->id()).ok());
  EXPECT_EQ(WaitDone(**training).state, OperationState::kCancelled);
}

}  // namespace
}  // namespace memprofd
