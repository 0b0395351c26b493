// Training under a byte budget: the chooser's configuration fits when the
// same steps run for real on the CPU, a budget nothing can meet is refused
// before anything runs, and a generous one changes nothing.

#include "core/plan/budget.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <set>
#include <string>

#include "core/memory/install.h"
#include "core/memory/recorder.h"
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
  absl::StatusOr<std::vector<MeasuredStep>> measured = MeasureTrainingSteps(
      choice->spec, c10::Device(c10::DeviceType::CPU), memory::MemoryRecorder::Global());
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

// Checkpointing part of the layers: half of them lowers the planned peak
// between none and all, the chooser plans each level (a quarter, half,
// three quarters, all), and a budget just above half the layers
// checkpointed is met without checkpointing all of them. One sequence per
// step, so that no micro-batch split is possible.
TEST_F(BudgetTest, SomeLayersCheckpointedWhenThatIsEnough) {
  PlanSpec request = Request();
  request.train.batch_size = 1;
  request.train.seq_len = request.model.max_position_embeddings;
  const int64_t layers = request.model.num_hidden_layers;
  ASSERT_GE(layers, 4);
  std::vector<int64_t> peaks;
  for (int64_t k : {int64_t{0}, layers / 2, layers}) {
    PlanSpec spec = request;
    spec.train.gradient_checkpointing = k > 0;
    spec.train.checkpoint_layers = k < layers ? k : 0;
    absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(spec);
    ASSERT_TRUE(plan.ok()) << plan.status();
    peaks.push_back(plan->peak_allocated_bytes);
  }
  EXPECT_GT(peaks[0], peaks[1]);
  EXPECT_GT(peaks[1], peaks[2]);
  // Just above half the layers checkpointed: no micro-batch split or
  // offloading is as fast (the speed model: 1 + k / 3N).
  absl::StatusOr<BudgetChoice> choice = ChooseUnderBudget(request, peaks[1] + 1);
  ASSERT_TRUE(choice.ok()) << choice.status();
  std::cout << "tiny 1x" << request.train.seq_len << " eager: peaks " << peaks[0]
            << " (no checkpointing), " << peaks[1] << " (" << layers / 2 << " of "
            << layers << " layers), " << peaks[2] << " (all); budget " << peaks[1] + 1
            << ": chose " << choice->chosen.Describe(request) << "\n";
  std::set<int64_t> levels;
  for (const BudgetCandidate& c : choice->candidates)
    levels.insert(c.checkpointed_layers);
  EXPECT_EQ(levels.size(), 5u);  // 0, N/4, N/2, 3N/4, N
  EXPECT_LT(choice->chosen.checkpointed_layers, layers);
  EXPECT_LE(choice->chosen.plan.peak_allocated_bytes, peaks[1] + 1);
}

// A batch with many divisors (720,720 has 240) plans about log2(batch)
// micro-batch sizes, every one a Train accepts (its accumulation within
// kMaxGradAccumulationSteps), so neither the choice nor the smallest peak
// proposed is a configuration the daemon then refuses.
TEST_F(BudgetTest, ManyDivisorsPlanHalvingMicroBatchesATrainAccepts) {
  PlanSpec request;
  request.model = testing::SmallLlamaConfig();
  request.train.batch_size = 720720;
  request.train.seq_len = 4;
  request.train.grad_accumulation_steps = 2;
  request.offload.spill_dir = ::testing::TempDir();
  absl::StatusOr<BudgetChoice> choice = ChooseUnderBudget(request, int64_t{1} << 50);
  ASSERT_TRUE(choice.ok()) << choice.status();
  std::set<int64_t> micro;
  for (const BudgetCandidate& c : choice->candidates) {
    micro.insert(c.batch_size);
    EXPECT_LE(c.grad_accumulation_steps, kMaxGradAccumulationSteps) << c.batch_size;
    EXPECT_EQ(c.batch_size * c.grad_accumulation_steps, 720720 * 2);
  }
  std::cout << micro.size() << " micro-batch sizes, " << choice->candidates.size()
            << " candidates for 720,720 windows x 2\n";
  EXPECT_LE(micro.size(), 21u);
  EXPECT_EQ(*micro.rbegin(), 720720);
  EXPECT_GE(*micro.begin(), 720720 * 2 / kMaxGradAccumulationSteps);
}

// A cancel stops budget planning before its next dry run, or within one
// between layers: CANCELLED, at once.
TEST_F(BudgetTest, ACancelStopsThePlanningWithinADryRun) {
  PlanSpec request = Request();
  int polls = 0;
  request.cancelled = [&polls] { return ++polls >= 20; };
  absl::StatusOr<BudgetChoice> choice = ChooseUnderBudget(request, 1);
  EXPECT_EQ(choice.status().code(), absl::StatusCode::kCancelled) << choice.status();
  EXPECT_EQ(polls, 20);  // no poll after the one that said stop
}

TEST_F(BudgetTest, NonPositiveBudgetIsInvalid) {
  EXPECT_EQ(ChooseUnderBudget(Request(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memprofd::plan
