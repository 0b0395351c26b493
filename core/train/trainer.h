#ifndef MEMPROFD_CORE_TRAIN_TRAINER_H_
#define MEMPROFD_CORE_TRAIN_TRAINER_H_

// Training steps over a LlamaModel: next-token cross-entropy, AdamW, optional
// gradient clipping, accumulation and per-layer checkpointing, with phase
// markers and hooks for the memory recorder and the activation offloader.

#include <ATen/core/Generator.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/llama.h"
#include "core/train/data.h"
#include "core/train/train_options.h"

namespace memprofd {

class FusedAdamW;

// Callbacks a session installs around every step; all optional. They run on
// the owner thread, inside the step.
struct StepHooks {
  // Held (the returned token kept alive) during the forward pass of the
  // embedding, the decoder layers and the final norm: the offloader's
  // saved-tensor scope.
  std::function<std::shared_ptr<void>()> body_scope;
  // Held during the lm_head forward and the loss (large, cheap to recompute
  // activations that the offloader leaves alone).
  std::function<std::shared_ptr<void>()> head_scope;
  // After each micro-batch's forward (the loss computed, every scope above
  // closed), before its backward.
  std::function<void()> after_forward;
  // After BeginStep(global_step), before the first micro-batch.
  std::function<void(int64_t global_step)> before_step;
  // After a successful step, before EndStep and before Run's on_step; may add
  // to the report.
  std::function<void(StepReport&)> after_step;
  // After a step failed inside the boundary (`status`, not OK), before its
  // gradients are cleared and before EndStep: the OOM report's moment.
  std::function<void(const absl::Status& status, int64_t global_step)> on_failure;
};

// Trains one model. Holds the AdamW optimizer, whose state (moments, step
// counts) persists across Step and Run calls; new options with another
// learning rate, betas, eps or weight decay update it in place. Keep one
// Trainer per loaded model and make a new one when the model is replaced.
//
// Every step runs inside TorchBoundary: an out-of-memory error fails that
// step with RESOURCE_EXHAUSTED (other LibTorch errors: INTERNAL), clears the
// gradients and leaves the model and the optimizer usable (the parameters
// are unchanged unless the failure struck inside the optimizer update).
//
// Thread-safety: none; the owner thread calls everything. Phase markers
// (BeginStep/EndStep, PhaseScope) are process-wide.
class Trainer {
 public:
  // `model` is not owned and must outlive the trainer.
  explicit Trainer(LlamaModel* model);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void set_hooks(StepHooks hooks) { hooks_ = std::move(hooks); }

  // One optimizer step (grad_accumulation_steps micro-batches of batch_size windows drawn
  // from `data` by `generator`). INVALID_ARGUMENT for options that
  // ValidateTrainOptions or data.Validate(seq_len) reject; otherwise the
  // failure of the step as above. Marks BeginStep/EndStep(global_step) and
  // the forward, backward and optimizer phases.
  absl::StatusOr<StepReport> Step(const TrainOptions& options, const TokenDataset& data,
                                  at::Generator& generator);

  // options.steps steps on options.data, windows drawn by a generator seeded
  // with options.seed. Calls `on_step` (optional) after each step and
  // `cancelled` (optional) before each; when it returns true the run stops
  // and returns OK with result.cancelled set and the steps done so far.
  // Errors: the options' or data's INVALID_ARGUMENT, or the first failed
  // step's status (the steps before it were reported through on_step).
  absl::StatusOr<TrainResult> Run(
      const TrainOptions& options,
      const std::function<void(const StepReport&)>& on_step = {},
      const std::function<bool()>& cancelled = {});

  // The same over `data`, already checked by the caller (TokenDataset::Create
  // and Validate(options.seq_len)); options are still validated.
  absl::StatusOr<TrainResult> Run(
      const TrainOptions& options, const TokenDataset& data,
      const std::function<void(const StepReport&)>& on_step = {},
      const std::function<bool()>& cancelled = {});

  // The optimizer's state tensors (AdamW moments; empty before the first
  // step), for memory accounting. Owner thread only.
  std::vector<at::Tensor> OptimizerState() const;

  // Steps completed over the trainer's life.
  int64_t global_step() const { return global_step_; }
  LlamaModel* model() const { return model_; }
  // Drops the optimizer state; the next step starts AdamW afresh.
  void ResetOptimizer();

 private:
  absl::StatusOr<StepReport> StepUnchecked(const TrainOptions& options,
                                           const TokenDataset& data,
                                           at::Generator& generator, int64_t step_in_run);
  // Creates the optimizer on first use; updates its hyperparameters after.
  void ConfigureOptimizer(const TrainOptions& options);
  void ClearGradients();

  LlamaModel* const model_;
  std::unique_ptr<FusedAdamW> optimizer_;
  StepHooks hooks_;
  int64_t global_step_ = 0;
};

// A CPU generator seeded with `seed`, for TokenDataset::NextBatch.
at::Generator MakeDataGenerator(uint64_t seed);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_TRAINER_H_
