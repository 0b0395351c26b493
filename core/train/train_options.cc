#include "core/train/train_options.h"

#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace memprofd {
namespace {

absl::Status AtLeastOne(absl::string_view field, int64_t value) {
  if (value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be at least 1, got ", value));
  }
  return absl::OkStatus();
}

absl::Status NonNegativeFinite(absl::string_view field, double value) {
  if (!(value >= 0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be a finite number >= 0, got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

bool CheckpointsLayer(const TrainOptions& options, int64_t layer) {
  return options.gradient_checkpointing &&
         (options.checkpoint_layers == 0 || layer < options.checkpoint_layers);
}

absl::Status ValidateTrainOptions(const TrainOptions& o,
                                  int64_t max_position_embeddings) {
  RETURN_IF_ERROR(AtLeastOne("steps", o.steps));
  RETURN_IF_ERROR(AtLeastOne("batch_size", o.batch_size));
  RETURN_IF_ERROR(AtLeastOne("seq_len", o.seq_len));
  RETURN_IF_ERROR(AtLeastOne("grad_accumulation_steps", o.grad_accumulation_steps));
  if (o.lora.r != 0) RETURN_IF_ERROR(ValidateLoraOptions(o.lora));
  if (o.lora.r == 0 && o.lora.dropout != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora_dropout ", o.lora.dropout,
        " without lora_r: dropout belongs to the adapters a run adds (give lora_r and "
        "the other lora fields), and the adapters a model has keep theirs"));
  }
  if (o.base_dtype == BaseDtype::kBf16 && o.mixed_precision != MixedPrecision::kBf16) {
    return absl::InvalidArgumentError(
        "base_dtype bf16 needs mixed_precision bf16: a bf16 base computes under bf16 "
        "autocast (set both, or leave base_dtype float32)");
  }
  // Limits on what is merely large: a step of 10^9 micro-batches could not be
  // cancelled for hours, and a batch past these overflows a tensor's size.
  for (auto [name, value, limit] :
       {std::tuple<const char*, int64_t, int64_t>{"steps", o.steps, kMaxTrainSteps},
        {"batch_size", o.batch_size, kMaxBatchSize},
        {"grad_accumulation_steps", o.grad_accumulation_steps,
         kMaxGradAccumulationSteps}}) {
    if (value > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be at most ", limit, ", got ", value));
    }
  }
  if (o.seq_len > max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq_len ", o.seq_len, " exceeds the model's max_position_embeddings (",
        max_position_embeddings, "); use a seq_len of at most ",
        max_position_embeddings));
  }
  if (!(o.learning_rate > 0) || !std::isfinite(o.learning_rate)) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning_rate must be a finite number > 0, got ", o.learning_rate));
  }
  for (auto [name, beta] : {std::pair<const char*, double>{"beta1", o.beta1},
                            std::pair<const char*, double>{"beta2", o.beta2}}) {
    if (!(beta >= 0 && beta < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be in [0, 1), got ", beta));
    }
  }
  if (!(o.adam_eps > 0) || !std::isfinite(o.adam_eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("adam_eps must be a finite number > 0, got ", o.adam_eps));
  }
  if (o.checkpoint_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint_layers must be >= 0 (0: every layer), got ", o.checkpoint_layers));
  }
  if (o.checkpoint_layers > 0 && !o.gradient_checkpointing) {
    return absl::InvalidArgumentError(
        "checkpoint_layers is set but gradient_checkpointing is not: turn it on, or "
        "leave checkpoint_layers unset");
  }
  RETURN_IF_ERROR(NonNegativeFinite("weight_decay", o.weight_decay));
  RETURN_IF_ERROR(NonNegativeFinite("max_grad_norm", o.max_grad_norm));
  RETURN_IF_ERROR(ValidateDataSpec("data", o.data));
  RETURN_IF_ERROR(ValidateLrSchedule(o.lr_schedule, o.steps));
  if (o.eval_every_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval_every_steps must be >= 0 (0: no evaluation), got ", o.eval_every_steps));
  }
  if (o.eval_max_batches < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval_max_batches must be >= 0 (0: every window), got ", o.eval_max_batches));
  }
  if (o.eval_every_steps > 0 && !o.eval_data) {
    return absl::InvalidArgumentError(
        "eval_every_steps is set but eval_data is not: give the evaluation data");
  }
  if (o.eval_every_steps == 0 && o.eval_data) {
    return absl::InvalidArgumentError(
        "eval_data is given but eval_every_steps is not: say how often to evaluate");
  }
  if (o.eval_data) RETURN_IF_ERROR(ValidateDataSpec("eval_data", *o.eval_data));
  RETURN_IF_ERROR(ValidateLossChunkTokens(o.loss_chunk_tokens));
  return absl::OkStatus();
}

absl::StatusOr<ValidTrainOptions> ValidTrainOptions::Check(
    TrainOptions options, int64_t max_position_embeddings) {
  RETURN_IF_ERROR(ValidateTrainOptions(options, max_position_embeddings));
  return ValidTrainOptions(std::move(options), max_position_embeddings);
}

absl::StatusOr<ValidTrainOptions> MergeTrainOverrides(const TrainOptions& defaults,
                                                      const TrainOverrides& request,
                                                      int64_t max_position_embeddings) {
  if (!request.steps) {
    return absl::InvalidArgumentError(
        "steps: required (how many optimizer steps to run, at least 1)");
  }
  TrainOptions o = defaults;
  MEMPROFD_TRAIN_VALUE_FIELDS(MEMPROFD_MERGE_VALUE_FIELD)
  MEMPROFD_TRAIN_CHOICE_FIELDS(MEMPROFD_MERGE_CHOICE_FIELD)
  if (request.data) o.data = *request.data;
  if (request.eval_data) o.eval_data = request.eval_data;
  return ValidTrainOptions::Check(std::move(o), max_position_embeddings);
}

}  // namespace memprofd
