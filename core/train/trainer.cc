#include "core/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/attribution.h"
#include "core/common/phase.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/memory/tagging.h"
#include "core/train/adamw.h"
#include "core/train/autocast.h"
#include "core/train/checkpoint.h"
#include "core/train/chunked_loss.h"
#include "core/train/evaluate.h"

namespace memprofd {
namespace {

// A scalar tensor's value. A dry run on the meta device (core/plan) has
// shapes and no values: its loss and gradient norm read as 0, which keeps
// the step on its normal path (finite, no clipping).
double ValueOf(const at::Tensor& scalar) {
  return scalar.is_meta() ? 0.0 : scalar.item<double>();
}

// Thrown by the backward hooks that poll the step interrupt; the autograd
// engine hands it back to loss.backward()'s caller.
struct StepInterrupted : std::exception {
  const char* what() const noexcept override { return "step interrupted"; }
};

// Thrown by the backward hook on a unit's output when a listener's
// BeforeUnit fails (a collective of sharded data parallel); carries its
// status back to loss.backward()'s caller as StepInterrupted does.
struct UnitFailed : std::exception {
  explicit UnitFailed(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "a listener's BeforeUnit failed"; }
  absl::Status status;
};

// Every listener's BeforeUnit, in order: the first error.
absl::Status BeforeUnit(const StepListeners& listeners, const ModelUnit& unit,
                        bool backward) {
  for (StepListener* l : listeners) RETURN_IF_ERROR(l->BeforeUnit(unit, backward));
  return absl::OkStatus();
}

// After `unit`'s forward made `output`: every listener's AfterUnitForward,
// and a hook on `output` that calls their BeforeUnit(unit, true) when
// backward reaches it (before the unit's own backward).
void AfterUnitForward(const StepListeners& listeners, const ModelUnit& unit,
                      at::Tensor& output) {
  for (StepListener* l : listeners) l->AfterUnitForward(unit);
  if (listeners.empty() || !output.requires_grad()) return;
  output.register_hook([listeners, unit](const at::Tensor&) {
    absl::Status status = BeforeUnit(listeners, unit, /*backward=*/true);
    if (!status.ok()) throw UnitFailed(std::move(status));
  });
}

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Calls EndStep when a step ends, whichever way it ends.
class StepMarker {
 public:
  explicit StepMarker(int64_t global_step) : global_step_(global_step) {
    BeginStep(global_step_);
  }
  ~StepMarker() { EndStep(global_step_); }
  StepMarker(const StepMarker&) = delete;
  StepMarker& operator=(const StepMarker&) = delete;

 private:
  const int64_t global_step_;
};

// The listeners' scopes, taken in listener order and released in reverse.
template <typename Take>
std::vector<std::shared_ptr<void>> EnterScopes(const StepListeners& listeners,
                                               Take take) {
  std::vector<std::shared_ptr<void>> scopes;
  scopes.reserve(listeners.size());
  for (StepListener* l : listeners) scopes.push_back(take(*l));
  return scopes;
}

// Releases scopes last-taken first (a vector destroys its elements in
// unspecified order).
struct ScopeStack {
  std::vector<std::shared_ptr<void>> scopes;
  ~ScopeStack() {
    while (!scopes.empty()) scopes.pop_back();
  }
};

}  // namespace

EvalOptions EvalOptionsOf(const TrainOptions& o) {
  EvalOptions e;
  if (o.eval_data) e.data = *o.eval_data;
  e.batch_size = o.batch_size;
  e.seq_len = o.seq_len;
  e.max_batches = o.eval_max_batches;
  e.attn_implementation = o.attn_implementation;
  e.mixed_precision = o.mixed_precision;
  e.loss_chunk_tokens = o.loss_chunk_tokens;
  return e;
}

at::Generator MakeDataGenerator(uint64_t seed) {
  return at::detail::createCPUGenerator(seed);
}

Trainer::Trainer(LlamaModel* model) : model_(model) {}

Trainer::~Trainer() = default;

std::vector<at::Tensor> Trainer::UpdateGradients() const {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : model_->Parameters()) {
    const at::Tensor target = optimizer_ ? optimizer_->TargetOf(p) : at::Tensor();
    const at::Tensor& grad = target.defined() ? target.grad() : p.grad();
    if (grad.defined()) grads.push_back(grad);
  }
  return grads;
}

void Trainer::ClearGradients() {
  for (const at::Tensor& p : model_->Parameters()) {
    // set_to_none, as PyTorch's zero_grad(set_to_none=True): frees the memory.
    p.mutable_grad() = at::Tensor();
    if (optimizer_ == nullptr) continue;
    if (at::Tensor target = optimizer_->TargetOf(p); target.defined()) {
      target.mutable_grad() = at::Tensor();
    }
  }
}

DataShard Trainer::ShardOf(const StepListeners& listeners) {
  for (const StepListener* l : listeners) {
    if (std::optional<DataShard> shard = l->data_shard()) return *shard;
  }
  return DataShard();
}

absl::StatusOr<StepReport> Trainer::Step(const TrainOptions& options,
                                         const TokenDataset& data,
                                         at::Generator& generator,
                                         const StepListeners& listeners,
                                         const std::function<bool()>& interrupted) {
  RETURN_IF_ERROR(
      ValidateTrainOptions(options, model_->config().max_position_embeddings));
  RETURN_IF_ERROR(data.Validate(options.seq_len));
  RETURN_IF_ERROR(AddAdapters(options));
  return StepUnchecked(options, data, generator, 1, 0, options.steps,
                       StepContext{listeners, interrupted, ShardOf(listeners)});
}

absl::StatusOr<StepReport> Trainer::StepUnchecked(
    const TrainOptions& options, const TokenDataset& data, at::Generator& generator,
    int64_t step_in_run, int64_t schedule_position, int64_t schedule_steps,
    const StepContext& context) {
  const StepListeners& listeners = context.listeners;
  const DataShard shard = context.shard;
  // A sharded optimizer updates the pieces a data-parallel listener feeds;
  // without one over the same ranks, nothing would train.
  if (optimizer_shard_ && (shard.count != optimizer_shard_->world_size ||
                           shard.index != optimizer_shard_->rank)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the optimizer state is sharded for rank ", optimizer_shard_->rank, " of ",
        optimizer_shard_->world_size, ", but this step's data is shard ", shard.index,
        " of ", shard.count, ": train through the data-parallel run of those ranks"));
  }
  const Clock::time_point start = Clock::now();
  model_->set_attention_implementation(options.attn_implementation);
  StepReport report;
  report.step = step_in_run;
  report.global_step = global_step_ + 1;
  report.tokens = options.batch_size * options.seq_len * options.grad_accumulation_steps;
  report.learning_rate = LearningRateAt(options.lr_schedule, options.learning_rate,
                                        schedule_position, schedule_steps);

  StepMarker marker(report.global_step);
  for (StepListener* l : listeners) l->OnStepBegin(report.global_step);

  double loss_sum = 0.0;
  // A stage's own failure (data, a listener, an interrupt, a diverging
  // update), carried out of the boundary; the boundary's status is LibTorch's.
  absl::Status stages_status;
  absl::Status status = TorchBoundary("training step", [&] {
    stages_status = RunStepStages(options, data, generator, context, report, loss_sum);
  });
  if (!status.ok()) {
    for (StepListener* l : listeners) l->OnStepFailed(status, report.global_step);
  }
  ClearGradients();
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(stages_status);

  ++global_step_;
  report.loss = loss_sum;
  report.step_seconds = SecondsSince(start);
  report.tokens_per_second =
      report.step_seconds > 0 ? static_cast<double>(report.tokens) / report.step_seconds
                              : 0;
  for (StepListener* l : listeners) RETURN_IF_ERROR(l->OnStepEnd(report));
  return report;
}

namespace {

// Sets the model's LoRA dropout key for its lifetime (LlamaModel::
// SetLoraDropoutKey), and unsets it on every way out.
class LoraDropoutKeyScope {
 public:
  LoraDropoutKeyScope(LlamaModel& model, uint64_t key) : model_(model) {
    model_.SetLoraDropoutKey(key);
  }
  ~LoraDropoutKeyScope() { model_.SetLoraDropoutKey(std::nullopt); }
  LoraDropoutKeyScope(const LoraDropoutKeyScope&) = delete;
  LoraDropoutKeyScope& operator=(const LoraDropoutKeyScope&) = delete;

 private:
  LlamaModel& model_;
};

}  // namespace

// The stages of a step, in order: for each micro-batch NextMicroBatch,
// ForwardMicroBatch and BackwardMicroBatch, then ClipAndUpdate. Each returns
// the status that ends the step (cancelled, a listener's failure, bad data, a
// diverging update); LibTorch's exceptions are left to StepUnchecked's
// boundary.
absl::Status Trainer::RunStepStages(const TrainOptions& options, const TokenDataset& data,
                                    at::Generator& generator, const StepContext& context,
                                    StepReport& report, double& loss_sum) {
  ConfigureOptimizer(options, report.learning_rate);
  ClearGradients();
  for (int64_t micro = 0; micro < options.grad_accumulation_steps; ++micro) {
    if (micro > 0 && context.interrupted && context.interrupted()) {
      return absl::CancelledError(absl::StrCat("step interrupted after ", micro, " of ",
                                               options.grad_accumulation_steps,
                                               " micro-batches"));
    }
    ASSIGN_OR_RETURN(const MicroBatch batch,
                     NextMicroBatch(options, data, generator, context.shard, micro));
    // LoRA dropout's masks for this micro-batch's forward and backward: the
    // run's seed, the step, the micro-batch and the rank (its own rows).
    LoraDropoutKeyScope dropout(
        *model_,
        MixSeed(MixSeed(MixSeed(options.seed, static_cast<uint64_t>(global_step_)),
                        static_cast<uint64_t>(micro)),
                static_cast<uint64_t>(context.shard.index)));
    const Clock::time_point forward_start = Clock::now();
    ASSIGN_OR_RETURN(at::Tensor loss, ForwardMicroBatch(options, batch, context));
    const Clock::time_point backward_start = Clock::now();
    report.forward_seconds +=
        std::chrono::duration<double>(backward_start - forward_start).count();
    RETURN_IF_ERROR(BackwardMicroBatch(loss, batch, context));
    report.backward_seconds += SecondsSince(backward_start);
    loss_sum += ValueOf(loss);
  }
  const Clock::time_point update_start = Clock::now();
  RETURN_IF_ERROR(ClipAndUpdate(options, loss_sum, context, report));
  report.optimizer_seconds = SecondsSince(update_start);
  return absl::OkStatus();
}

absl::StatusOr<Trainer::MicroBatch> Trainer::NextMicroBatch(const TrainOptions& options,
                                                            const TokenDataset& data,
                                                            at::Generator& generator,
                                                            const DataShard& shard,
                                                            int64_t index) const {
  // Every rank draws the whole batch of all ranks and keeps its rows, so the
  // ranks together see what one process with the larger batch would.
  ASSIGN_OR_RETURN(TokenBatch batch, data.NextBatch(options.batch_size * shard.count,
                                                    options.seq_len, generator));
  const c10::Device device = model_->device();
  const int64_t first_row = options.batch_size * shard.index;
  MicroBatch out;
  out.inputs = batch.inputs.narrow(0, first_row, options.batch_size).to(device);
  out.targets = batch.targets.narrow(0, first_row, options.batch_size).to(device);
  out.index = index;
  out.last = index + 1 == options.grad_accumulation_steps;
  return out;
}

absl::StatusOr<at::Tensor> Trainer::ForwardMicroBatch(const TrainOptions& options,
                                                      const MicroBatch& batch,
                                                      const StepContext& context) {
  const StepListeners& listeners = context.listeners;
  const std::function<bool()>& interrupted = context.interrupted;
  at::Tensor loss;
  {
    PhaseScope phase(Phase::kForward);
    // Autocast covers the forward only; backward runs outside it, as with
    // torch.autocast (gradient checkpointing replays it).
    AutocastScope autocast(options.mixed_precision, model_->device().type());
    at::Tensor hidden;
    {
      ScopeStack scope{
          EnterScopes(listeners, [](StepListener& l) { return l.BodyScope(); })};
      // ForwardHidden, layer by layer, so that a long micro-batch can be
      // interrupted between layers, in forward here and in backward through
      // the hook on each layer's input.
      RETURN_IF_ERROR(BeforeUnit(listeners, ModelUnit::Embedding(), false));
      hidden = model_->Embed(batch.inputs);
      AfterUnitForward(listeners, ModelUnit::Embedding(), hidden);
      for (int64_t i = 0; i < model_->num_layers(); ++i) {
        if (i > 0 && interrupted) {
          if (interrupted()) {
            return absl::CancelledError(
                absl::StrCat("step interrupted in the forward of micro-batch ",
                             batch.index + 1, ", before layer ", i));
          }
          if (hidden.requires_grad()) {
            hidden.register_hook([interrupted](const at::Tensor&) {
              if (interrupted()) throw StepInterrupted();
            });
          }
        }
        RETURN_IF_ERROR(BeforeUnit(listeners, ModelUnit::Layer(i), false));
        hidden = CheckpointsLayer(options, i) ? CheckpointedLayer(*model_, i, hidden)
                                              : model_->Layer(i, hidden);
        AfterUnitForward(listeners, ModelUnit::Layer(i), hidden);
      }
      RETURN_IF_ERROR(BeforeUnit(listeners, ModelUnit::Head(), false));
      hidden = model_->FinalNorm(hidden);
    }
    ScopeStack scope{
        EnterScopes(listeners, [](StepListener& l) { return l.HeadScope(); })};
    loss = LanguageModelLoss(*model_, hidden, batch.targets, options.loss_chunk_tokens,
                             LossReduction::kMean);
    if (options.grad_accumulation_steps > 1)
      loss = loss / static_cast<double>(options.grad_accumulation_steps);
    for (StepListener* l : listeners) l->AfterUnitForward(ModelUnit::Head());
  }
  for (StepListener* l : listeners) l->OnForwardEnd();
  return loss;
}

absl::Status Trainer::BackwardMicroBatch(const at::Tensor& loss, const MicroBatch& batch,
                                         const StepContext& context) {
  const StepListeners& listeners = context.listeners;
  PhaseScope phase(Phase::kBackward);
  for (StepListener* l : listeners) l->BeforeBackward(batch.last);
  RETURN_IF_ERROR(BeforeUnit(listeners, ModelUnit::Head(), true));
  try {
    loss.backward();
  } catch (const StepInterrupted&) {
    return absl::CancelledError(absl::StrCat(
        "step interrupted in the backward of micro-batch ", batch.index + 1));
  } catch (const UnitFailed& failed) {
    return failed.status;
  }
  // Gradients AccumulateGrad made rather than adopted (a clone of a
  // non-stealable gradient) are gradients too, named by their parameter.
  for (const at::Tensor& p : model_->Parameters()) {
    if (!p.grad().defined()) continue;
    const std::optional<Attribution> param = memory::StorageAttribution(p);
    if (param) memory::TagStorage(p.grad(), param->module, Category::kGradients);
  }
  if (batch.last) {
    for (StepListener* l : listeners) RETURN_IF_ERROR(l->AfterBackward());
  }
  return absl::OkStatus();
}

absl::Status Trainer::ClipAndUpdate(const TrainOptions& options, double loss_sum,
                                    const StepContext& context, StepReport& report) {
  const StepListeners& listeners = context.listeners;
  PhaseScope phase(Phase::kOptimizer);
  const std::vector<at::Tensor> grads = UpdateGradients();
  std::vector<at::Tensor> norms;
  for (const at::Tensor& g : grads) norms.push_back(g.norm());
  double total = norms.empty() ? 0.0 : ValueOf(torch::stack(norms).norm());
  for (StepListener* l : listeners) {
    ASSIGN_OR_RETURN(total, l->CombineGradNorm(total));
  }
  report.grad_norm = total;
  // A NaN or infinite loss or gradient would make every weight NaN: the
  // update is skipped, so the model stays as it was, and the run fails.
  if (!std::isfinite(loss_sum) || !std::isfinite(total)) {
    ++nonfinite_steps_;
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", report.global_step, " has a non-finite ",
        std::isfinite(loss_sum) ? "gradient norm" : "loss", " (loss ", loss_sum,
        ", gradient norm ", total,
        "); its update was skipped and the weights are as they were before it. "
        "Lower learning_rate, or set max_grad_norm"));
  }
  if (options.max_grad_norm > 0 && total > options.max_grad_norm) {
    // torch.nn.utils.clip_grad_norm_'s coefficient.
    const double coef = options.max_grad_norm / (total + 1e-6);
    torch::NoGradGuard no_grad;
    for (const at::Tensor& g : grads) g.mul_(coef);
  }
  for (StepListener* l : listeners) l->BeforeUpdate();
  // The update is seen before it is made (on copies, a chunk at a time): one
  // that diverges is never applied, so the weights stay as they were.
  const FusedAdamW::Peek peek = optimizer_->PeekStep();
  const bool local_keep = peek.largest <= kMaxParameterMagnitude;
  bool keep = local_keep;
  for (StepListener* l : listeners) {
    ASSIGN_OR_RETURN(keep, l->AgreeOnUpdate(keep));
  }
  if (!keep) {
    ++nonfinite_steps_;
    std::string what = "another rank's share of the parameters";
    if (!local_keep) {
      what = "a parameter";
      for (const auto& [name, p] : model_->NamedParameters()) {
        if (p.unsafeGetTensorImpl() == peek.param.unsafeGetTensorImpl()) what = name;
      }
      what = absl::StrCat(what, std::isfinite(peek.largest)
                                    ? absl::StrFormat(" %.3g", peek.largest)
                                    : std::string(" not finite"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", report.global_step, "'s update would make ", what,
        " (every parameter must stay finite and within ", kMaxParameterMagnitude,
        " in magnitude): the training diverged. The update was not applied and the "
        "weights are as they were before it. Lower learning_rate (",
        options.learning_rate, "), or set max_grad_norm"));
  }
  optimizer_->Step();
  for (StepListener* l : listeners) RETURN_IF_ERROR(l->AfterUpdate());
  return absl::OkStatus();
}

absl::StatusOr<ValidTrainOptions> Trainer::Check(const TrainOptions& options) const {
  return ValidTrainOptions::Check(options, model_->config().max_position_embeddings);
}

absl::StatusOr<TrainResult> Trainer::Run(const ValidTrainOptions& valid,
                                         const TrainRunRequest& request) {
  // Checked for a model of at most this one's positions: valid here too.
  if (valid.max_position_embeddings() > model_->config().max_position_embeddings) {
    RETURN_IF_ERROR(Check(valid.get()).status());
  }
  const TrainOptions& options = valid.get();
  RETURN_IF_ERROR(AddAdapters(options));
  if (request.continue_last && (!run_ || !generator_.defined())) {
    return absl::FailedPreconditionError(
        "there is no training run to resume on this model: load a checkpoint with "
        "resume (LoadModel with resume, or the daemon's resume option at start) or train "
        "without resume");
  }
  // The data: the caller's, or read here.
  const int64_t vocab_size = model_->config().vocab_size;
  std::unique_ptr<TokenDataset> read_data;
  const TokenDataset* data = request.data;
  if (data == nullptr) {
    ASSIGN_OR_RETURN(read_data, TokenDataset::Create(options.data, vocab_size));
    data = read_data.get();
  }
  RETURN_IF_ERROR(data->Validate(options.seq_len));
  std::unique_ptr<TokenDataset> read_eval;
  const TokenDataset* eval_data = nullptr;
  if (options.eval_every_steps > 0) {
    eval_data = request.eval_data;
    if (eval_data == nullptr && options.eval_data) {
      ASSIGN_OR_RETURN(read_eval, TokenDataset::Create(*options.eval_data, vocab_size));
      eval_data = read_eval.get();
    }
    if (eval_data == nullptr) {
      return absl::InvalidArgumentError(
          "eval_every_steps is set but no evaluation data was given");
    }
    RETURN_IF_ERROR(eval_data->Validate(options.seq_len));
  }
  if (request.continue_last) {
    run_->options = options;
    run_->options.steps = run_->steps_completed + options.steps;
  } else {
    generator_ = MakeDataGenerator(options.seed);
    RunState run;
    run.options = options;
    run.sampler.seed = options.seed;
    run_ = std::move(run);
  }
  run_->data_tokens = data->size();
  return RunSteps(options, *data, eval_data, request);
}

absl::StatusOr<TrainResult> Trainer::RunSteps(const TrainOptions& options,
                                              const TokenDataset& data,
                                              const TokenDataset* eval_data,
                                              const TrainRunRequest& request) {
  const StepListeners& listeners = request.listeners;
  const std::function<bool()>& cancelled = request.cancelled;
  TrainResult result;
  const StepContext context{listeners, cancelled, ShardOf(listeners)};
  const Clock::time_point start = Clock::now();
  for (int64_t step = 1; step <= options.steps; ++step) {
    bool stop = false;
    for (StepListener* l : listeners) {
      ASSIGN_OR_RETURN(const bool listener_stops, l->AtBoundary());
      stop = stop || listener_stops;
      if (stop) break;
    }
    if (stop || (cancelled && cancelled())) {
      result.cancelled = true;
      break;
    }
    // Where the step's windows start, to put back if it is interrupted.
    const at::Generator before = cancelled ? generator_.clone() : at::Generator();
    absl::StatusOr<StepReport> stepped =
        StepUnchecked(options, data, generator_, step, run_->steps_completed,
                      run_->options.steps, context);
    if (absl::IsCancelled(stepped.status()) && cancelled) {
      ClearGradients();
      generator_.set_state(before.get_state());
      result.cancelled = true;
      break;
    }
    ASSIGN_OR_RETURN(StepReport report, std::move(stepped));
    // The cursor and the losses move before on_step, whose snapshots (taken
    // at the next boundary) must see this step as done.
    run_->steps_completed += 1;
    run_->sampler.batches_drawn += options.grad_accumulation_steps;
    run_->sampler.windows_drawn += options.grad_accumulation_steps * options.batch_size;
    recent_losses_.emplace_back(report.global_step, report.loss);
    while (recent_losses_.size() > kRecentLossesKept) recent_losses_.pop_front();
    if (options.eval_every_steps > 0 &&
        run_->steps_completed % options.eval_every_steps == 0) {
      for (StepListener* l : listeners) RETURN_IF_ERROR(l->BeforeEvaluation());
      EvalUnits* units = nullptr;
      for (StepListener* l : listeners) {
        if (units == nullptr) units = l->evaluation_units();
      }
      absl::StatusOr<EvalResult> eval =
          EvaluateModel(*model_, *eval_data, EvalOptionsOf(options), {}, units);
      for (StepListener* l : listeners) RETURN_IF_ERROR(l->AfterEvaluation());
      ASSIGN_OR_RETURN(report.eval, std::move(eval));
      report.eval->global_step = global_step_;
    }
    if (step == 1) result.first_loss = report.loss;
    result.last_loss = report.loss;
    result.steps_completed = step;
    result.tokens += report.tokens;
    for (StepListener* l : listeners) l->OnStepReported(report);
    if (request.on_step) request.on_step(report);
  }
  result.seconds = SecondsSince(start);
  result.mean_tokens_per_second =
      result.seconds > 0 ? static_cast<double>(result.tokens) / result.seconds : 0;
  result.global_step = global_step_;
  return result;
}

}  // namespace memprofd
