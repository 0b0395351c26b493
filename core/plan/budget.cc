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
  double time = c.gradient_checkpointing ? 4.0 / 3.0 : 1.0;
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
  return absl::StrCat("batch ", batch_size, " x ", grad_accumulation_steps,
                      " accumulated, checkpointing ",
                      gradient_checkpointing ? "on" : "off", ", offloading ", offload_to);
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
  // Micro-batches that divide the request's: the same windows, the same
  // effective batch.
  std::vector<int64_t> micro_batches;
  for (int64_t m = batch; m >= 1; --m) {
    if (batch % m == 0) micro_batches.push_back(m);
  }
  offload::OffloadOptions offloaded = base.offload;
  if (!offloaded.enabled) {
    offloaded = offload::OffloadOptions();
    offloaded.target = base.target == PlanSpec::Target::kCuda ? offload::Target::kHost
                                                              : offload::Target::kDisk;
    offloaded.spill_dir = base.offload.spill_dir;
  }
  offloaded.enabled = true;

  BudgetChoice choice;
  for (int64_t m : micro_batches) {
    for (bool ckpt : {false, true}) {
      for (bool offload : {false, true}) {
        PlanSpec spec = base;
        spec.train.batch_size = m;
        spec.train.grad_accumulation_steps = accumulation * (batch / m);
        spec.train.gradient_checkpointing = ckpt;
        if (offload) {
          spec.offload = offloaded;
        } else {
          spec.offload.enabled = false;
        }
        spec.capacity_bytes = budget_bytes;
        absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(spec);
        if (!plan.ok()) return plan.status();
        BudgetCandidate c;
        c.batch_size = m;
        c.grad_accumulation_steps = spec.train.grad_accumulation_steps;
        c.gradient_checkpointing = ckpt;
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
    choice.spec.train.gradient_checkpointing = c.gradient_checkpointing;
    if (c.offload) {
      choice.spec.offload = offloaded;
    } else {
      choice.spec.offload.enabled = false;
    }
    return choice;
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
