#include "core/plan/budget.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/attribution.h"

namespace memprofd::plan {
namespace {

double RelativeStepTime(const PlanSpec& base, const BudgetCandidate& c,
                        const BudgetOptions& options) {
  const bool cuda = base.target == PlanSpec::Target::kCuda;
  const double flops = options.flops_per_second > 0 ? options.flops_per_second
                       : cuda                       ? 5e13
                                                    : 5e10;
  const double bandwidth = options.offload_bytes_per_second > 0
                               ? options.offload_bytes_per_second
                           : cuda ? 2e10
                                  : 1e9;
  // A step is 6 N tokens FLOPs; recomputing a layer's forward adds its 2:
  // x 4/3 with every layer checkpointed, in proportion for some.
  double time = 1.0;
  if (c.num_layers > 0) {
    time += static_cast<double>(c.checkpointed_layers) /
            static_cast<double>(c.num_layers) / 3.0;
  }
  const int64_t extra_micro = c.grad_accumulation_steps -
                              std::max<int64_t>(base.train.grad_accumulation_steps, 1);
  time *=
      1.0 + kMicroBatchOverhead * static_cast<double>(std::max<int64_t>(extra_micro, 0));
  if (c.offload) {
    const double tokens = static_cast<double>(c.batch_size) *
                          static_cast<double>(base.train.seq_len) *
                          static_cast<double>(c.grad_accumulation_steps);
    const double compute =
        6.0 * static_cast<double>(c.plan.parameter_count) * tokens / flops;
    const double copies = 2.0 * static_cast<double>(c.plan.offloaded_bytes) *
                          static_cast<double>(c.grad_accumulation_steps) / bandwidth;
    if (compute > 0) time += (1.0 - kOffloadHidden) * copies / compute;
  }
  return time;
}

// The checkpointing levels a budget tries for a model of `layers` decoder
// layers: none, a quarter, half and three quarters of them (rounded, each
// once), and all.
std::vector<int64_t> CheckpointLevels(int64_t layers) {
  std::vector<int64_t> levels = {0};
  for (int64_t quarter = 1; quarter <= 3; ++quarter) {
    const int64_t k = (layers * quarter + 2) / 4;
    if (k > levels.back() && k < layers) levels.push_back(k);
  }
  if (layers > 0) levels.push_back(layers);
  return levels;
}

// The micro-batch sizes tried for a request of `batch` windows of
// `accumulation` micro-batches: divisors of `batch` (the same windows, the
// same effective batch) whose accumulation stays within what a Train
// accepts (kMaxGradAccumulationSteps), and of those only the largest at or
// below batch / 2^j for each j: a peak falls smoothly as the micro-batch
// shrinks, so halving steps find the fitting one in about log2(batch) sizes
// instead of one dry run per divisor (720,720 has 240).
std::vector<int64_t> MicroBatches(int64_t batch, int64_t accumulation) {
  std::vector<int64_t> out;
  for (int64_t target = batch; target >= 1; target /= 2) {
    for (int64_t m = target; m >= 1; --m) {
      if (batch % m != 0) continue;
      if (accumulation * (batch / m) > kMaxGradAccumulationSteps) break;
      if (out.empty() || m < out.back()) out.push_back(m);
      break;
    }
  }
  return out;
}

// The category holding the most bytes at a plan's peak.
Category Dominant(const MemoryPlan& plan) {
  size_t best = 0;
  for (size_t i = 1; i < plan.categories_at_peak.size(); ++i) {
    if (plan.categories_at_peak[i] > plan.categories_at_peak[best]) best = i;
  }
  return static_cast<Category>(best);
}

}  // namespace

std::string BudgetCandidate::Describe(const PlanSpec& base) const {
  const char* offload_to =
      !offload ? "off"
      : base.offload.enabled
          ? (base.offload.target == offload::Target::kHost ? "to host" : "to disk")
      : base.target == PlanSpec::Target::kCuda ? "to host"
                                               : "to disk";
  const std::string checkpointing =
      checkpointed_layers == 0 ? "off"
      : checkpointed_layers >= num_layers
          ? "on"
          : absl::StrCat(checkpointed_layers, " of ", num_layers, " layers");
  return absl::StrCat("batch ", batch_size, " x ", grad_accumulation_steps,
                      " accumulated, checkpointing ", checkpointing, ", offloading ",
                      offload_to);
}

absl::StatusOr<BudgetChoice> ChooseUnderBudget(const PlanSpec& base, int64_t budget_bytes,
                                               const BudgetOptions& options) {
  if (budget_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_budget_bytes must be > 0 (got ", budget_bytes,
                     "); leave it unset for none"));
  }
  const int64_t batch = base.train.batch_size;
  const int64_t accumulation = std::max<int64_t>(base.train.grad_accumulation_steps, 1);
  const std::vector<int64_t> micro_batches = MicroBatches(batch, accumulation);
  if (micro_batches.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory_budget_bytes: batch_size ", batch, " x grad_accumulation_steps ",
        accumulation, " leaves no micro-batch within ", kMaxGradAccumulationSteps,
        " accumulated steps; lower grad_accumulation_steps"));
  }
  offload::OffloadOptions offloaded = base.offload;
  if (!offloaded.enabled) {
    offloaded = offload::OffloadOptions();
    offloaded.target = base.target == PlanSpec::Target::kCuda ? offload::Target::kHost
                                                              : offload::Target::kDisk;
    offloaded.spill_dir = base.offload.spill_dir;
  }
  offloaded.enabled = true;

  // The train options that checkpoint the first k of the model's layers.
  const int64_t layers = base.model.num_hidden_layers;
  auto checkpoint = [layers](TrainOptions* train, int64_t k) {
    train->gradient_checkpointing = k > 0;
    train->checkpoint_layers = k > 0 && k < layers ? k : 0;
  };
  BudgetChoice choice;
  for (int64_t m : micro_batches) {
    for (int64_t k : CheckpointLevels(layers)) {
      for (bool offload : {false, true}) {
        PlanSpec spec = base;
        spec.train.batch_size = m;
        spec.train.grad_accumulation_steps = accumulation * (batch / m);
        checkpoint(&spec.train, k);
        if (offload) {
          spec.offload = offloaded;
        } else {
          spec.offload.enabled = false;
        }
        spec.capacity_bytes = budget_bytes;
        // Only what a Train would accept is planned, chosen or proposed.
        if (!ValidTrainOptions::Check(spec.train, base.model.max_position_embeddings)
                 .ok()) {
          continue;
        }
        absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(spec);
        if (!plan.ok()) return plan.status();
        BudgetCandidate c;
        c.batch_size = m;
        c.grad_accumulation_steps = spec.train.grad_accumulation_steps;
        c.checkpointed_layers = k;
        c.num_layers = layers;
        c.offload = offload;
        c.plan = *std::move(plan);
        c.fits = c.plan.fits;
        c.relative_step_time = RelativeStepTime(base, c, options);
        choice.candidates.push_back(std::move(c));
      }
    }
  }
  std::stable_sort(choice.candidates.begin(), choice.candidates.end(),
                   [](const BudgetCandidate& a, const BudgetCandidate& b) {
                     return a.relative_step_time < b.relative_step_time;
                   });
  for (const BudgetCandidate& c : choice.candidates) {
    if (!c.fits) continue;
    choice.chosen = c;
    choice.spec = base;
    choice.spec.train.batch_size = c.batch_size;
    choice.spec.train.grad_accumulation_steps = c.grad_accumulation_steps;
    checkpoint(&choice.spec.train, c.checkpointed_layers);
    if (c.offload) {
      choice.spec.offload = offloaded;
    } else {
      choice.spec.offload.enabled = false;
    }
    return choice;
  }
  if (choice.candidates.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_budget_bytes: no configuration of ", base.train.batch_size,
                     " windows a step passes a Train's checks"));
  }
  const BudgetCandidate& smallest = *std::min_element(
      choice.candidates.begin(), choice.candidates.end(),
      [](const BudgetCandidate& a, const BudgetCandidate& b) {
        return a.plan.peak_allocated_bytes < b.plan.peak_allocated_bytes;
      });
  const Category dominant = Dominant(smallest.plan);
  return absl::ResourceExhaustedError(absl::StrCat(
      "no configuration fits memory_budget_bytes ", budget_bytes,
      ": the smallest planned peak is ", smallest.plan.peak_allocated_bytes, " bytes (",
      smallest.Describe(base), "); its largest part is ", CategoryName(dominant), " (",
      smallest.plan.categories_at_peak[static_cast<size_t>(dominant)],
      " bytes); raise the budget, or train a smaller model or shorter sequences"));
}

}  // namespace memprofd::plan
