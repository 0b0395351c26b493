// Training under a byte budget: the chooser's configuration fits when the
// same steps run for real on the CPU, a budget nothing can meet is refused
// before anything runs, and a generous one changes nothing.

#include "core/plan/budget.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>

#include "core/memory/install.h"
#include "core/plan/calibration.h"
#include "tests/testing/llama.h"

namespace memprofd::plan {
namespace {

class BudgetTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(memory::InstallMemoryAccounting().ok()); }

  static PlanSpec Request() {
    PlanSpec spec;
    spec.model = testing::PresetConfig("tiny");
    spec.train.batch_size = 8;
    spec.train.seq_len = 256;
    spec.train.attn_implementation = AttentionImplementation::kEager;
    spec.offload.spill_dir = ::testing::TempDir();
    return spec;
  }
};

TEST_F(BudgetTest, HalfwayBudgetTrainsUnderItForReal) {
  const PlanSpec request = Request();
  absl::StatusOr<MemoryPlan> unconstrained = PlanTrainingStep(request);
  ASSERT_TRUE(unconstrained.ok()) << unconstrained.status();
  const int64_t budget =
      (unconstrained->model_state_bytes + unconstrained->peak_allocated_bytes) / 2;
  absl::StatusOr<BudgetChoice> choice = ChooseUnderBudget(request, budget);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_LE(choice->chosen.plan.peak_allocated_bytes, budget);
  EXPECT_GT(choice->chosen.relative_step_time, 1.0);  // something had to give
  // The same effective batch.
  EXPECT_EQ(choice->spec.train.batch_size * choice->spec.train.grad_accumulation_steps,
            request.train.batch_size * request.train.grad_accumulation_steps);
  absl::StatusOr<std::vector<MeasuredStep>> measured =
      MeasureTrainingSteps(choice->spec, c10::Device(c10::DeviceType::CPU));
  ASSERT_TRUE(measured.ok()) << measured.status();
  int64_t real = 0;
  for (const MeasuredStep& s : *measured) real = std::max(real, s.peak_allocated_bytes);
  std::cout << "budget " << budget << " B (unconstrained peak "
            << unconstrained->peak_allocated_bytes << ", model state "
            << unconstrained->model_state_bytes << "): chose "
            << choice->chosen.Describe(request) << ", planned "
            << choice->chosen.plan.peak_allocated_bytes << " B, measured " << real
            << " B, relative step time " << choice->chosen.relative_step_time << " ("
            << choice->candidates.size() << " candidates)\n";
  EXPECT_LE(real, budget);
}

TEST_F(BudgetTest, BudgetBelowTheModelStateIsRefusedNamingTheSmallestPeak) {
  const PlanSpec request = Request();
  absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<BudgetChoice> choice =
      ChooseUnderBudget(request, plan->resident_between_steps_bytes / 2);
  ASSERT_EQ(choice.status().code(), absl::StatusCode::kResourceExhausted)
      << choice.status();
  const std::string message(choice.status().message());
  EXPECT_NE(message.find("smallest planned peak"), std::string::npos) << message;
  // What dominates it: AdamW's two moments, twice the parameters.
  EXPECT_NE(message.find("largest part is optimizer_state"), std::string::npos)
      << message;
}

TEST_F(BudgetTest, AGenerousBudgetKeepsTheRequest) {
  const PlanSpec request = Request();
  absl::StatusOr<BudgetChoice> choice = ChooseUnderBudget(request, int64_t{1} << 40);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->chosen.relative_step_time, 1.0);
  EXPECT_EQ(choice->spec.train.batch_size, 8);
  EXPECT_EQ(choice->spec.train.grad_accumulation_steps, 1);
  EXPECT_FALSE(choice->spec.train.gradient_checkpointing);
  EXPECT_FALSE(choice->spec.offload.enabled);
}

TEST_F(BudgetTest, NonPositiveBudgetIsInvalid) {
  EXPECT_EQ(ChooseUnderBudget(Request(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memprofd::plan
