#ifndef MEMPROFD_CORE_TRAIN_TRAINER_H_
#define MEMPROFD_CORE_TRAIN_TRAINER_H_

// Training steps over a LlamaModel: next-token cross-entropy, AdamW with a
// learning-rate schedule, optional gradient clipping, accumulation, per-layer
// checkpointing, bf16 autocast and periodic evaluation, with phase markers
// for the memory recorder and the step listeners of each run (the activation
// offloader, data parallel, the session: step_listener.h).

#include <ATen/core/Generator.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/common/flat_shard.h"
#include "core/model/llama.h"
#include "core/train/data.h"
#include "core/train/step_listener.h"
#include "core/train/train_options.h"
#include "core/train/trainer_state.h"

namespace memprofd {

class FusedAdamW;

// What Trainer::Run is given besides its options.
struct TrainRunRequest {
  // Called after each step, after the listeners' OnStepReported.
  std::function<void(const StepReport&)> on_step;
  // A cheap predicate, polled as Trainer::Run says; empty: never.
  std::function<bool()> cancelled;
  // Take part in every step (step_listener.h), in this order.
  StepListeners listeners;
  // The training data, already created (TokenDataset::Create); null: read
  // options->data. Validated against seq_len here either way.
  const TokenDataset* data = nullptr;
  // The evaluation data; null: read options->eval_data when evaluation is
  // due (INVALID_ARGUMENT when there is none).
  const TokenDataset* eval_data = nullptr;
  // Continue the last run instead of starting one.
  bool continue_last = false;
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

  // One optimizer step (grad_accumulation_steps micro-batches of batch_size windows drawn
  // from `data` by `generator`). INVALID_ARGUMENT for options that
  // ValidateTrainOptions or data.Validate(seq_len) reject; otherwise the
  // failure of the step as above. Marks BeginStep/EndStep(global_step) and
  // the forward, backward and optimizer phases.
  // Every listener is called as step_listener.h describes (AtBoundary aside:
  // Step is no run).
  // `interrupted` (optional; a cheap predicate) is polled within the step as
  // Run polls `cancelled`: true abandons it, CANCELLED, with no update.
  absl::StatusOr<StepReport> Step(const TrainOptions& options, const TokenDataset& data,
                                  at::Generator& generator,
                                  const StepListeners& listeners = {},
                                  const std::function<bool()>& interrupted = {});

  // The LoRA adapters options.lora asks for (options.lora.r > 0), added to
  // the model (LlamaModel::AddLora, A drawn from options.seed) unless it has
  // them; nothing with r 0 (the run trains what the model has: every
  // parameter, or its adapters). FAILED_PRECONDITION when the model has
  // other adapters, or none and this trainer has already updated its
  // parameters. Run and Step call it; a data-parallel run calls it before
  // DataParallel wraps the trainer, so that the adapters are among the
  // parameters it synchronises.
  absl::Status AddAdapters(const TrainOptions& options);

  // `options` checked for this model (ValidTrainOptions::Check with its
  // max_position_embeddings): what Run takes. INVALID_ARGUMENT as Check.
  absl::StatusOr<ValidTrainOptions> Check(const TrainOptions& options) const;

  // Runs options->steps steps: a new run, or (request.continue_last) more
  // of the last one. See TrainRunRequest for what else a run is given.
  //
  // A new run draws its windows with a generator seeded with options->seed.
  // A continued run (the last one started by Run, or restored by Restore)
  // draws on from where it stopped, so the windows, and with the same
  // options the losses, are those an uninterrupted run would have had; its
  // total becomes the steps done so far plus options->steps.
  //
  // `request.cancelled` is polled at every boundary, after the listeners'
  // AtBoundary, and within every step: before each micro-batch after the
  // first, and within each micro-batch between its decoder layers, in
  // forward (before layers 1..L-1) and in backward (as the gradient reaches
  // the inputs of layers L-1..1), so that even one long micro-batch stops
  // within a layer's work. True at a boundary stops the run there; true
  // within a step abandons it: no optimizer update (the weights stay as the
  // last completed step left them), its gradients dropped, the run's
  // generator put back where the step began (a continued run draws the same
  // windows). Either way the run returns OK with result.cancelled and the
  // steps completed. A data-parallel run passes none (a rank leaving
  // mid-step would leave the others in the gradient all-reduce): its ranks
  // agree on stopping at boundaries, through a listener's AtBoundary.
  //
  // With options->eval_every_steps > 0, after every eval_every_steps-th step
  // the model is evaluated on the evaluation data (EvaluateModel with
  // EvalOptionsOf(options)) and the result goes in that step's report,
  // before on_step; an evaluation's failure ends the run like a step's.
  //
  // Errors: INVALID_ARGUMENT for data (or evaluation data, when due) that
  // cannot be read or is too short for seq_len, or for options checked for
  // a model of more positions than this one; FAILED_PRECONDITION for
  // continue_last with no run to continue; a listener's AtBoundary error;
  // or the first failed step's status (the steps before it were reported).
  // The run becomes the one a continued run continues and State() saves.
  absl::StatusOr<TrainResult> Run(const ValidTrainOptions& options,
                                  const TrainRunRequest& request = {});

  // The optimizer's state tensors (AdamW moments; empty before the first
  // step), for memory accounting. Owner thread only.
  std::vector<at::Tensor> OptimizerState() const;

  // What a checkpoint stores of the trainer besides the optimizer tensors,
  // as of now (the generator's bytes are copied). Call at a step boundary.
  TrainerState State() const;
  // The optimizer state by name, for a checkpoint: "<param>.exp_avg",
  // "<param>.exp_avg_sq" and "<param>.step" (a float32 scalar) for every
  // parameter that has had an update, in state-dict order, a tied head once
  // under the embedding's name. The live tensors, not copies.
  std::vector<std::pair<std::string, at::Tensor>> NamedOptimizerState() const;
  // The optimizer's hyperparameters as string metadata (for the
  // safetensors header of a checkpoint's optimizer file).
  std::map<std::string, std::string> OptimizerMetadata() const;

  // Restores a checkpoint into this trainer (made for the checkpoint's
  // model): global step, run, generator, recent losses and, named as
  // NamedOptimizerState names them, the optimizer state (copied onto the
  // parameters' devices). Everything is checked before anything changes:
  // FAILED_PRECONDITION naming the tensor when a name is not of a trainable
  // parameter of the model, a shape differs from its parameter's, one of a
  // parameter's three tensors is missing, or a trainable parameter has no
  // state although the checkpoint has trained, or a LoRA checkpoint's base
  // fingerprint is not the model's base; DATA_LOSS when the generator
  // state is not a CPU generator's. RESOURCE_EXHAUSTED when the copies do
  // not fit. Call once, on a fresh trainer, before any step.
  // `shard` (optional): this rank's place in a run with its optimizer state
  // sharded (ShardOptimizer, before the state is set): each parameter keeps
  // the state of its flat piece only, narrowed from the checkpoint's whole
  // state or given as that piece (a 1-D moment of its length), so any world
  // size resumes any checkpoint.
  absl::Status Restore(const TrainerState& state,
                       const std::vector<std::pair<std::string, at::Tensor>>& optimizer,
                       const FlatShardSpec* shard = nullptr);

  // Shards the optimizer (FusedAdamW::ShardFlat) for this rank, now if it
  // exists and whenever it is made (the first step, Restore): a data-parallel
  // run that shards the optimizer state calls it before its first step, with
  // the same spec every time. INTERNAL for another spec than before.
  absl::Status ShardOptimizer(const FlatShardSpec& spec);
  // The optimizer, made (with default hyperparameters, which each step
  // replaces) if there is none yet: for a data-parallel listener that
  // feeds its pieces' gradients (FusedAdamW::TargetOf) or moves its
  // targets (Retarget). The trainer keeps it.
  FusedAdamW* optimizer();

  // Steps completed over the trainer's life.
  int64_t global_step() const { return global_step_; }
  // Steps refused because their loss or gradient norm was not finite, or
  // because their update would have made a parameter not finite or larger
  // than kMaxParameterMagnitude (their update skipped), since this trainer
  // was made.
  int64_t nonfinite_steps() const { return nonfinite_steps_; }

  // The largest |value| an update may give a parameter. No trained model
  // comes near it (weights are of order 1, norm scales tens); an update past
  // it has diverged, and keeping it would leave Evaluate and Snapshot
  // serving a broken model. Such a step fails and its update is not applied.
  static constexpr double kMaxParameterMagnitude = 1e6;
  // The run a continued Run continues; unset before the first run. Its
  // sampler's generator_state is empty (State() fills it).
  const std::optional<RunState>& run() const { return run_; }
  LlamaModel* model() const { return model_; }

 private:
  // What one step is given besides its options and data.
  struct StepContext {
    const StepListeners& listeners;
    const std::function<bool()>& interrupted;  // empty: never
    DataShard shard;
  };
  // The shard the listeners ask for (the whole batch when none does).
  static DataShard ShardOf(const StepListeners& listeners);
  // One step; its learning rate is the schedule's at 0-based
  // schedule_position of schedule_steps.
  absl::StatusOr<StepReport> StepUnchecked(const TrainOptions& options,
                                           const TokenDataset& data,
                                           at::Generator& generator, int64_t step_in_run,
                                           int64_t schedule_position,
                                           int64_t schedule_steps,
                                           const StepContext& context);
  // One micro-batch of a step: this rank's rows, on the model's device.
  struct MicroBatch {
    at::Tensor inputs;
    at::Tensor targets;
    int64_t index = 0;  // 0-based, within the step
    bool last = false;  // the step's last: gradients are complete after it
  };
  // A step's named stages (trainer.cc says what each does); `report` gets
  // their timings, the gradient norm; `loss_sum` the micro-batches' losses.
  absl::Status RunStepStages(const TrainOptions& options, const TokenDataset& data,
                             at::Generator& generator, const StepContext& context,
                             StepReport& report, double& loss_sum);
  absl::StatusOr<MicroBatch> NextMicroBatch(const TrainOptions& options,
                                            const TokenDataset& data,
                                            at::Generator& generator,
                                            const DataShard& shard, int64_t index) const;
  // The loss of one micro-batch (divided by the accumulation steps), with
  // autograd's graph for BackwardMicroBatch.
  absl::StatusOr<at::Tensor> ForwardMicroBatch(const TrainOptions& options,
                                               const MicroBatch& batch,
                                               const StepContext& context);
  // Accumulates the micro-batch's gradients; after the last, the listeners'
  // AfterBackward (the gradient synchronisation) completes them.
  absl::Status BackwardMicroBatch(const at::Tensor& loss, const MicroBatch& batch,
                                  const StepContext& context);
  // The gradient norm (combined across ranks), clipping, and the AdamW
  // update unless the loss, the norm or the update is not sane.
  absl::Status ClipAndUpdate(const TrainOptions& options, double loss_sum,
                             const StepContext& context, StepReport& report);
  // The steps of Run, on run_ and generator_, over data validated for
  // options->seq_len. A step's learning rate is the schedule's at its
  // position in the whole run (the steps of the run before it plus its
  // own), so a continued run gets the rates an uninterrupted one would have
  // had.
  absl::StatusOr<TrainResult> RunSteps(const TrainOptions& options,
                                       const TokenDataset& data,
                                       const TokenDataset* eval_data,
                                       const TrainRunRequest& request);
  // Creates the optimizer on first use; updates its hyperparameters after
  // (the learning rate: this step's, from the schedule).
  void ConfigureOptimizer(const TrainOptions& options, double learning_rate);
  // The gradients the update reads, in model order: each trainable
  // parameter's, or its piece's when the optimizer is sharded.
  std::vector<at::Tensor> UpdateGradients() const;
  void ClearGradients();

  LlamaModel* const model_;
  std::unique_ptr<FusedAdamW> optimizer_;
  std::optional<FlatShardSpec> optimizer_shard_;  // ShardOptimizer's
  bool optimizer_configured_ = false;             // by a step or Restore
  int64_t nonfinite_steps_ = 0;
  int64_t global_step_ = 0;
  // The run a continued Run continues (its sampler's generator_state is filled
  // only by State()), and its generator.
  std::optional<RunState> run_;
  at::Generator generator_;
  std::deque<std::pair<int64_t, double>> recent_losses_;
};

// The evaluation a training run does every eval_every_steps: its eval_data,
// batch_size, seq_len, attention and mixed precision, eval_max_batches.
EvalOptions EvalOptionsOf(const TrainOptions& options);

// A CPU generator seeded with `seed`, for TokenDataset::NextBatch.
at::Generator MakeDataGenerator(uint64_t seed);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_TRAINER_H_
