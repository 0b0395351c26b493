#include "core/plan/step_runner.h"

#include <ATen/core/Generator.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/dist/data_parallel.h"
#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/offload/step_listener.h"
#include "core/train/data.h"
#include "core/train/memory_tags.h"
#include "core/train/meta_autocast.h"
#include "core/train/trainer.h"

namespace memprofd::plan::internal {
namespace {

// spec.train over one synthetic window of seq_len + 1 tokens (token 0), for
// kPlannedSteps steps, without evaluation.
TrainOptions PlannedOptions(const PlanSpec& spec) {
  TrainOptions options = spec.train;
  options.steps = kPlannedSteps;
  // Every micro-batch after the first starts from the same memory (the
  // gradients exist, nothing else stays), so a step of k >= 2 micro-batches
  // peaks as one of 2 does: a plan never runs more, however many a Train
  // asks for (4096 would take minutes even on meta, and hold up shutdown).
  options.grad_accumulation_steps =
      std::min<int64_t>(options.grad_accumulation_steps, kPlannedMicroBatches);
  options.data = DataSpec();
  options.data.kind = DataSpec::Kind::kInlineTokens;
  options.data.tokens.assign(
      static_cast<size_t>(std::max<int64_t>(options.seq_len, 0) + 1), 0);
  options.eval_every_steps = 0;
  options.eval_data.reset();
  return options;
}

// The offloader's options for the planned device, which a meta run cannot
// tell by itself: on a CPU the host target is where the activations already
// are (nothing moves); the read-ahead's automatic depth is the device's.
offload::OffloadOptions OffloadOptionsFor(const PlanSpec& spec) {
  offload::OffloadOptions options = spec.offload;
  const bool cpu = spec.target == PlanSpec::Target::kCpu;
  if (cpu && options.target == offload::Target::kHost) options.enabled = false;
  if (options.prefetch_depth == offload::kPrefetchAuto) {
    options.prefetch_depth = cpu ? 0 : offload::kCudaPrefetchDepth;
  }
  return options;
}

}  // namespace

}  // namespace memprofd::plan::internal

namespace memprofd::plan {

absl::Status CheckDataParallelPlan(const PlanSpec& spec) {
  if (spec.world_size < 1 || spec.world_size > kMaxPlannedWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be between 1 and ", kMaxPlannedWorldSize,
                     " (ranks of the data-parallel run to plan), got ", spec.world_size));
  }
  return absl::OkStatus();
}

}  // namespace memprofd::plan

namespace memprofd::plan::internal {

absl::Status CheckPlannable(const PlanSpec& spec) {
  if (spec.train.mixed_precision == MixedPrecision::kBf16) {
    // The dry run follows the target's autocast policy (meta_autocast.h).
    RETURN_IF_ERROR(EnableMetaAutocast());
  }
  RETURN_IF_ERROR(offload::ValidateOffloadOptions(spec.offload));
  if (spec.capacity_bytes < 0) {
    return absl::InvalidArgumentError(
        "plan: capacity_bytes must be >= 0 (0: no verdict)");
  }
  RETURN_IF_ERROR(CheckDataParallelPlan(spec));
  return ValidTrainOptions::Check(PlannedOptions(spec),
                                  spec.model.max_position_embeddings)
      .status();
}

absl::Status RunPlannedSteps(
    const PlanSpec& spec, c10::Device device, ProcessGroup* group,
    const std::function<void(LlamaModel&)>& prepare_model,
    const std::function<void(int64_t)>& before_step,
    const std::function<void(int64_t, const offload::OffloadStats&)>& after_step,
    offload::MetaCopies meta_copies) {
  RETURN_IF_ERROR(CheckPlannable(spec));
  const bool data_parallel = spec.world_size > 1;
  if (data_parallel && (group == nullptr || group->world_size() != spec.world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: the steps of a rank of ", spec.world_size, " need a group of that size"));
  }
  const TrainOptions options = PlannedOptions(spec);
  // A bf16 step autocasts as its target device would.
  MetaAutocastTargetScope autocast_target(spec.target == PlanSpec::Target::kCuda
                                              ? MetaAutocastTarget::kCuda
                                              : MetaAutocastTarget::kCpu);
  ASSIGN_OR_RETURN(const ValidTrainOptions valid,
                   ValidTrainOptions::Check(options, spec.model.max_position_embeddings));
  ASSIGN_OR_RETURN(std::unique_ptr<TokenDataset> data,
                   TokenDataset::Create(options.data, spec.model.vocab_size));
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                   LlamaModel::Create(spec.model, /*seed=*/0, device));
  TagModelMemory(*model);
  if (prepare_model) prepare_model(*model);
  Trainer trainer(model.get());
  ASSIGN_OR_RETURN(
      std::unique_ptr<offload::Offloader> offloader,
      offload::Offloader::Create(OffloadOptionsFor(spec), device, meta_copies));
  offload::OffloadStepListener listener(offloader.get(), model.get());
  StepListeners listeners = {&listener};
  std::unique_ptr<DataParallel> ranks;
  if (data_parallel) {
    DataParallelOptions dp_options;
    dp_options.sharding = spec.sharding;
    ASSIGN_OR_RETURN(ranks, DataParallel::Create(group, &trainer, dp_options));
    listeners.push_back(ranks.get());
  }
  at::Generator generator = MakeDataGenerator(options.seed);
  for (int64_t step = 1; step <= kPlannedSteps; ++step) {
    if (spec.cancelled && spec.cancelled()) {
      return absl::CancelledError(absl::StrCat("plan cancelled before step ", step));
    }
    if (before_step) before_step(step);
    absl::StatusOr<StepReport> report =
        trainer.Step(valid, *data, generator, listeners, spec.cancelled);
    if (!report.ok()) {
      return absl::Status(
          report.status().code(),
          absl::StrCat("plan: step ", step, " of the run on ", device.str(),
                       " failed: ", report.status().message()));
    }
    if (after_step) after_step(step, listener.last_step());
  }
  return absl::OkStatus();
}

}  // namespace memprofd::plan::internal
