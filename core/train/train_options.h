#ifndef MEMPROFD_CORE_TRAIN_TRAIN_OPTIONS_H_
#define MEMPROFD_CORE_TRAIN_TRAIN_OPTIONS_H_

// What a training request asks for and what training reports back. Plain
// structs, free of LibTorch, so that the server can fill and read them.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/config.h"
#include "core/model/lora_options.h"
#include "core/train/eval_options.h"
#include "core/train/lr_schedule.h"
#include "core/train/request_fields.h"

namespace memprofd {

// The largest values ValidateTrainOptions takes (memprofd.v1.TrainRequest
// documents them): a run checks for cancellation between steps, so one step
// must stay short enough to cancel, and a batch's element count must fit.
inline constexpr int64_t kMaxTrainSteps = int64_t{1} << 40;
inline constexpr int64_t kMaxBatchSize = int64_t{1} << 20;
inline constexpr int64_t kMaxGradAccumulationSteps = 4096;

// What one training run does, every field given. Fields are validated by
// ValidateTrainOptions(). Names follow memprofd.v1.TrainRequest's; a field a
// request can set is listed in request_fields.h, which says where it is kept
// here.
struct TrainOptions;
// Whether decoder layer `layer` (0-based) runs checkpointed under `options`.
bool CheckpointsLayer(const TrainOptions& options, int64_t layer);

struct TrainOptions {
  int64_t steps = 100;  // optimizer steps
  int64_t batch_size = 8;
  int64_t seq_len = 128;
  double learning_rate = 1e-3;
  // Seeds the generator that picks the data windows. The model's init has
  // its own seed (LlamaModel::Create).
  uint64_t seed = 0;
  DataSpec data;
  // Recompute each decoder layer in backward instead of keeping its
  // activations.
  bool gradient_checkpointing = false;
  // With gradient_checkpointing: how many decoder layers, the first ones,
  // are checkpointed (CheckpointsLayer); 0, or at least the model's layer
  // count: all of them.
  int64_t checkpoint_layers = 0;
  // How attention is computed (see AttentionImplementation).
  AttentionImplementation attn_implementation = AttentionImplementation::kSdpa;
  // AdamW (decoupled weight decay; applied to matrices and embeddings, not
  // to RMSNorm weights).
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double adam_eps = 1e-8;
  // Clip the global gradient L2 norm to this; 0 turns clipping off.
  double max_grad_norm = 0.0;
  // Micro-batches of batch_size accumulated per optimizer step.
  int64_t grad_accumulation_steps = 1;
  // The learning rate of each step: learning_rate is the peak (see
  // lr_schedule.h); the default keeps it constant.
  LrSchedule lr_schedule;
  // Autocast of the forward passes (bf16: fp32 master weights and AdamW
  // state).
  MixedPrecision mixed_precision = MixedPrecision::kNo;
  // Evaluate on eval_data every this many steps of the run (0: never), over
  // at most eval_max_batches batches of batch_size x seq_len (0: all).
  int64_t eval_every_steps = 0;
  std::optional<DataSpec> eval_data;
  int64_t eval_max_batches = 0;
  // How the head and the loss are computed, in training and in its
  // evaluations: kLossChunkAutomatic (chunks sized from the vocabulary and
  // hidden size), kLossChunkOff (the logits materialized) or tokens per
  // chunk (core/train/chunked_loss.h).
  int64_t loss_chunk_tokens = kLossChunkAutomatic;
  // LoRA (lora_options.h): with lora.r > 0 the run trains adapters on a
  // frozen base, added at its start unless the model has them (Trainer::Run).
  LoraOptions lora;
  // The dtype of a LoRA run's frozen base (lora_options.h): bf16 casts the
  // base when the run starts and needs mixed_precision bf16.
  BaseDtype base_dtype = BaseDtype::kFloat32;
};

// A training request as a client sends it: each field unset takes
// TrainOptions' default; `steps` has none and must be given.
// MergeTrainOverrides fills the gaps and validates the result. The fields are
// request_fields.h's lists (same names as memprofd.v1.TrainRequest's): a value
// field as std::optional of its type, a named choice as the name the client
// sent ("sdpa", "cosine", "bf16"), checked by the merge.
struct TrainOverrides {
  MEMPROFD_TRAIN_VALUE_FIELDS(MEMPROFD_OPTIONAL_VALUE_FIELD)
  MEMPROFD_TRAIN_CHOICE_FIELDS(MEMPROFD_OPTIONAL_CHOICE_FIELD)
  // Unset: the defaults' data (the embedded corpus, or a resumed run's own).
  std::optional<DataSpec> data;
  std::optional<DataSpec> eval_data;
};

// One optimizer step.
struct StepReport {
  int64_t step = 0;         // 1-based within this Run
  int64_t global_step = 0;  // 1-based over the trainer's life
  // The mean next-token cross-entropy over the step's tokens, and their
  // number (batch_size * seq_len * grad_accumulation_steps) and rate. In a
  // data-parallel run, all three are the global batch's: the loss over every
  // rank's tokens, the tokens and the rates summed over the ranks.
  double loss = 0.0;
  int64_t tokens = 0;
  double tokens_per_second = 0.0;
  // This rank's own loss, in a data-parallel run (over its shard of the
  // batch); unset otherwise.
  std::optional<double> rank_loss;
  double step_seconds = 0.0;
  // Time spent in each phase, summed over micro-batches. The optimizer phase
  // includes the gradient norm and clipping; drawing batches counts in
  // step_seconds only.
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;
  double optimizer_seconds = 0.0;
  // Global L2 norm of the gradients before clipping.
  double grad_norm = 0.0;
  // The learning rate this step's update used.
  double learning_rate = 0.0;
  // Set on the steps after which the run evaluated (eval_every_steps).
  std::optional<EvalResult> eval;
};

// The outcome of a Run. When `cancelled`, the steps that ran are counted and
// the caller should report CANCELLED (Operation::Finish(CancelledError,
// result) keeps this result).
struct TrainResult {
  int64_t steps_completed = 0;
  double first_loss = 0.0;
  double last_loss = 0.0;
  int64_t tokens = 0;
  double seconds = 0.0;
  double mean_tokens_per_second = 0.0;
  int64_t global_step = 0;  // the trainer's global step after the run
  bool cancelled = false;
  // Set by the session: a run under a memory budget's configuration
  // (TrainSpec::memory_budget_bytes), and the run's planned peak (the
  // chosen configuration's, or its calibration plan's; 0: none).
  std::string budget_choice;
  int64_t planned_peak_bytes = 0;
  // Set by the session for a run the daemon's drain stopped: the newest
  // checkpoint under the snapshot root (what --resume=latest loads) and the
  // global step it holds; empty and 0 when there is none.
  std::string resume_checkpoint;
  int64_t resume_global_step = 0;
};

// OK, or INVALID_ARGUMENT naming the field and the accepted range: steps,
// batch_size, seq_len and grad_accumulation_steps >= 1; seq_len <=
// max_position_embeddings; learning_rate > 0; betas in [0, 1); adam_eps > 0;
// weight_decay and
// max_grad_norm >= 0 and finite; bytes_per_token 2 or 4 for a token file; a
// path for file kinds; the schedule's (ValidateLrSchedule); eval_every_steps
// and eval_max_batches >= 0, eval_every_steps > 0 exactly when eval_data is
// given; loss_chunk_tokens's (ValidateLossChunkTokens).
absl::Status ValidateTrainOptions(const TrainOptions& options,
                                  int64_t max_position_embeddings);

// TrainOptions that ValidateTrainOptions accepted for a model of the
// max_position_embeddings given. Only Check and MergeTrainOverrides make one,
// so code that takes one (the session's training, Trainer::Run) checks the
// options no further. Reads as the TrainOptions it holds.
class ValidTrainOptions {
 public:
  static absl::StatusOr<ValidTrainOptions> Check(TrainOptions options,
                                                 int64_t max_position_embeddings);

  const TrainOptions& get() const { return options_; }
  const TrainOptions* operator->() const { return &options_; }
  operator const TrainOptions&() const { return options_; }  // NOLINT: reads as one
  int64_t max_position_embeddings() const { return max_position_embeddings_; }

 private:
  ValidTrainOptions(TrainOptions options, int64_t max_position_embeddings)
      : options_(std::move(options)), max_position_embeddings_(max_position_embeddings) {}

  TrainOptions options_;
  int64_t max_position_embeddings_ = 0;
};

// `request` over `defaults`, validated by ValidateTrainOptions; also
// INVALID_ARGUMENT when `steps` is not given. The one place a client's
// request is checked.
absl::StatusOr<ValidTrainOptions> MergeTrainOverrides(const TrainOptions& defaults,
                                                      const TrainOverrides& request,
                                                      int64_t max_position_embeddings);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_TRAIN_OPTIONS_H_
