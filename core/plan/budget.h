#ifndef MEMPROFD_CORE_PLAN_BUDGET_H_
#define MEMPROFD_CORE_PLAN_BUDGET_H_

// Training under a byte budget: the configurations a Train could run with —
// gradient checkpointing off or on, activation offloading off or on, and the
// micro-batch split into smaller ones with gradient accumulation keeping the
// same effective batch — each planned (planner.h), and the fastest whose
// planned peak fits chosen.
//
// The speed model (relative step time; the request's own configuration, no
// checkpointing, no offloading, whole micro-batches, is 1):
//   - checkpointing recomputes every decoder layer's forward: a step's FLOPs
//     are 6·N·tokens (forward 2, backward 4), checkpointing adds 2: × 4/3;
//   - each micro-batch beyond the request's costs kMicroBatchOverhead of a
//     step (smaller matmuls run less efficiently; the FLOPs are the same);
//   - offloading costs the bytes it moves out and back that compute does not
//     hide: 2·offloaded_bytes / bytes_per_second, over the step's compute
//     time 6·N·tokens / flops_per_second, of which kOffloadHidden is hidden.
// Whole-model checkpointing only: the trainer checkpoints every layer or
// none, so k-of-N layer plans are not candidates.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/plan/planner.h"

namespace memprofd::plan {

inline constexpr double kMicroBatchOverhead = 0.05;
inline constexpr double kOffloadHidden = 0.5;

struct BudgetOptions {
  // The device's arithmetic and the offloader's copy bandwidth, for the
  // speed model; zero: the defaults of the target (CPU: 5e10 FLOP/s and
  // 1e9 B/s to disk; CUDA: 5e13 FLOP/s and 2e10 B/s to pinned host memory).
  double flops_per_second = 0;
  double offload_bytes_per_second = 0;
};

// One planned candidate.
struct BudgetCandidate {
  int64_t batch_size = 0;  // the micro-batch
  int64_t grad_accumulation_steps = 0;
  // Decoder layers checkpointed, the first ones: 0 (off) to num_layers (all).
  int64_t checkpointed_layers = 0;
  int64_t num_layers = 0;
  bool offload = false;
  MemoryPlan plan;
  double relative_step_time = 0;  // the speed model's
  bool fits = false;
  // "batch 4 x 2 accumulated, checkpointing on, offloading to disk"
  // ("checkpointing 8 of 16 layers" for some of them).
  std::string Describe(const PlanSpec& base) const;
};

struct BudgetChoice {
  PlanSpec spec;  // the request with the chosen configuration
  BudgetCandidate chosen;
  std::vector<BudgetCandidate> candidates;  // every one planned, fastest first
};

// The candidates: micro-batches that divide base's batch_size (with the
// accumulation keeping the effective batch, at most
// kMaxGradAccumulationSteps), the largest at or below batch_size / 2^j for
// each j, x checkpointing of none, the first quarter, half, three quarters
// or all of the layers x offloading off or on; only those a Train accepts
// (ValidTrainOptions::Check) are planned, chosen or proposed. base.cancelled
// is polled before each dry run and within it (CANCELLED).
// Plans the candidates of `base` (its batch_size, grad_accumulation_steps
// and offload options are the request's; the offload target is base's, or
// the target's default when base has offloading off) and returns the fastest
// whose peak is at most budget_bytes. INVALID_ARGUMENT for a budget <= 0;
// the planner's errors; RESOURCE_EXHAUSTED when nothing fits, naming the
// smallest peak any candidate reaches, its configuration and the category
// that dominates it.
absl::StatusOr<BudgetChoice> ChooseUnderBudget(const PlanSpec& base, int64_t budget_bytes,
                                               const BudgetOptions& options = {});

}  // namespace memprofd::plan

#endif  // MEMPROFD_CORE_PLAN_BUDGET_H_
