#ifndef MEMPROFD_CORE_PLAN_STEP_RUNNER_H_
#define MEMPROFD_CORE_PLAN_STEP_RUNNER_H_

// The steps a plan is made of, run on any device: the planner runs them on
// meta, calibration (calibration.h) on a real device, so that both run the
// very same thing.

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "core/dist/process_group.h"
#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/plan/planner.h"

namespace memprofd::plan::internal {

// The two optimizer steps every plan is made of, each of at most two
// micro-batches (a step's peak is the same for any count >= 2).
inline constexpr int kPlannedSteps = 2;
inline constexpr int64_t kPlannedMicroBatches = 2;

// The SDPA kernel a dry run of `spec` stands in for what its target would
// run (LlamaModel::set_meta_sdpa_kernel), for the dtype its attention sees
// (bf16 under mixed precision, else float32): on the CPU target, the one
// LibTorch's CPU choice picks; on CUDA, the one this process's first GPU
// picks when it has one (asked with tiny tensors: the choice depends on the
// heads, head size, dtype and device, not on batch or length), else the rule
// of LibTorch 2.11 on sm80 and later for a causal, unmasked call: flash
// attention for bf16 with head sizes up to 256 (grouped heads included),
// else memory-efficient attention when the head size is a multiple of the
// GEMM alignment (8 elements for bf16, 4 for float32) and the heads are not
// grouped, else the math path. A choice the dry run has no stand-in for
// (cuDNN attention) plans as flash attention, whose outputs it shares.
LlamaModel::MetaSdpaKernel SdpaKernelFor(const PlanSpec& spec);

// OK when `spec` can be planned; UNIMPLEMENTED / INVALID_ARGUMENT /
// RESOURCE_EXHAUSTED as PlanTrainingStep documents (the size admission:
// kMaxPlannedLayers, kMaxPlannedBytes, kMaxPlanHostBytes), before anything
// is made for the plan.
absl::Status CheckPlannable(const PlanSpec& spec);

// Makes spec.model on `device` (seed 0; parameters tagged as a loaded
// model's are), a trainer and an offloader with spec.offload, and runs
// kPlannedSteps steps of spec.train, each of at most kPlannedMicroBatches
// micro-batches, over a synthetic window of seq_len + 1 tokens, calling
// before_step(k) and after_step(k, offload statistics of step k) (k = 1, 2;
// either may be empty) around step k. before_step(1) comes before the run's
// setup (Trainer::AddAdapters: adapters added, a frozen base cast to bf16;
// data parallel made), which belongs to the first step as a Train's does.
// `prepare_model` (may be empty) sees the model before that. With
// spec.world_size > 1 the steps are
// rank group->rank()'s of a data-parallel run: DataParallel over `group`
// (ProcessGroup::ForPlan for a plan, a real group for a measurement) with
// spec.sharding is the step listener after the offloader's, as in a Train;
// INVALID_ARGUMENT when `group` is null or of another size then. Everything
// it made is freed before it returns. A step's failure as its status,
// prefixed with the step. `meta_copies`: when a dry run's copies out
// complete (offloader.h).
absl::Status RunPlannedSteps(
    const PlanSpec& spec, c10::Device device, ProcessGroup* group,
    const std::function<void(LlamaModel&)>& prepare_model,
    const std::function<void(int64_t)>& before_step,
    const std::function<void(int64_t, const offload::OffloadStats&)>& after_step,
    offload::MetaCopies meta_copies = offload::MetaCopies::kAtOnce);

}  // namespace memprofd::plan::internal

#endif  // MEMPROFD_CORE_PLAN_STEP_RUNNER_H_
