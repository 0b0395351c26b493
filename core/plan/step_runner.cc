#include "core/plan/step_runner.h"

#include <ATen/core/Generator.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
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
  // Two steps run, but the schedule's fields (warmup_steps) were checked
  // against the request's steps: keep those, at least kPlannedSteps.
  options.steps = std::max<int64_t>(options.steps, kPlannedSteps);
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
  RETURN_IF_ERROR(plan::CheckPlanSize(spec));
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
                   LlamaModel::Create(spec.model, /*seed=*/0, device,
                                      ScalarTypeOf(spec.model_base_dtype)));
  TagModelMemory(*model);
  if (prepare_model) prepare_model(*model);
  Trainer trainer(model.get());
  ASSIGN_OR_RETURN(
      std::unique_ptr<offload::Offloader> offloader,
      offload::Offloader::Create(OffloadOptionsFor(spec), device, meta_copies));
  offload::OffloadStepListener listener(offloader.get(), model.get());
  StepListeners listeners = {&listener};
  // The run's setup, as the daemon's training does it before data parallel
  // takes the parameters (the adapters added, the base cast); it counts to
  // the first step.
  if (before_step) before_step(1);
  if (absl::Status added = trainer.AddAdapters(options); !added.ok()) {
    return absl::Status(added.code(),
                        absl::StrCat("plan: setting up the run on ", device.str(),
                                     " failed: ", added.message()));
  }
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
    if (before_step && step > 1) before_step(step);
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

namespace memprofd::plan {

absl::Status CheckPlanSize(const PlanSpec& spec) {
  const LlamaConfig& m = spec.model;
  auto too_large = [](absl::string_view what, absl::string_view fix) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: ", what, " is beyond what a plan counts; ", fix));
  };
  if (m.num_hidden_layers > kMaxPlannedLayers) {
    return too_large(absl::StrCat("num_hidden_layers ", m.num_hidden_layers, " (at most ",
                                  kMaxPlannedLayers,
                                  ": a dry run keeps about 100 KB of host bookkeeping "
                                  "per layer, and the deepest released models have 126)"),
                     "plan a shallower model");
  }
  // The model's own state (float32 parameters, gradients and AdamW's two
  // moments) in bytes, without overflow.
  const int64_t params = m.NumParameters();
  int64_t state = 0;
  if (params < 0 || __builtin_mul_overflow(params, int64_t{16}, &state) ||
      state > kMaxPlannedBytes) {
    return too_large(
        absl::StrCat("a model of ", params < 0 ? "more than 2^63" : "",
                     params < 0 ? "" : absl::StrCat(params),
                     " parameters (16 bytes each to train, over 2^62 bytes)"),
        "check vocab_size, hidden_size, intermediate_size and "
        "num_hidden_layers");
  }
  // The largest activations of a micro-batch: the logits, the MLP's and
  // (eager) the attention scores, each well inside int64's bytes.
  const int64_t batch = std::max<int64_t>(spec.train.batch_size, 1);
  const int64_t seq = std::max<int64_t>(spec.train.seq_len, 1);
  int64_t tokens = 0;
  if (__builtin_mul_overflow(batch, seq + 1, &tokens)) tokens = INT64_MAX;
  int64_t scores = 0;  // eager attention's, per token
  if (__builtin_mul_overflow(m.num_attention_heads, seq, &scores)) scores = INT64_MAX;
  for (const auto& [name, width] :
       {std::pair<const char*, int64_t>{"vocab_size", m.vocab_size},
        {"intermediate_size", m.intermediate_size},
        {"num_attention_heads x seq_len", scores}}) {
    int64_t elements = 0;
    if (__builtin_mul_overflow(tokens, width, &elements) ||
        elements > kMaxPlannedBytes / 8) {
      return too_large(absl::StrCat("batch_size ", batch, " x seq_len ", seq, " x ", name,
                                    " (a tensor of a micro-batch over 2^59 elements)"),
                       "lower batch_size or seq_len");
    }
  }
  // Real host memory: the synthetic window and a micro-batch's inputs and
  // targets (int64), and the rotary caches the model computes on the CPU.
  int64_t rope = 0;
  int64_t host = 0;
  if (__builtin_mul_overflow(m.max_position_embeddings, m.head_dim(), &rope) ||
      __builtin_mul_overflow(rope, int64_t{12}, &rope) ||
      __builtin_mul_overflow(tokens, int64_t{20}, &host) ||
      __builtin_add_overflow(host, rope, &host) || host > kMaxPlanHostBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "plan: the dry run would hold more than ", kMaxPlanHostBytes,
        " bytes of real host memory (20 bytes per token of a micro-batch of ", batch,
        " x ", seq, ", 12 per max_position_embeddings x head_dim of the rotary caches, ",
        m.max_position_embeddings, " x ", m.head_dim(),
        "); plan a smaller batch_size or seq_len, or a model with fewer positions"));
  }
  return absl::OkStatus();
}

}  // namespace memprofd::plan
