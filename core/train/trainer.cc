#include "core/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/phase.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/train/adamw.h"
#include "core/train/checkpoint.h"

namespace memprofd {
namespace {

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

std::shared_ptr<void> Enter(const std::function<std::shared_ptr<void>()>& scope) {
  return scope ? scope() : nullptr;
}

}  // namespace

at::Generator MakeDataGenerator(uint64_t seed) {
  return at::detail::createCPUGenerator(seed);
}

Trainer::Trainer(LlamaModel* model) : model_(model) {}

Trainer::~Trainer() = default;

void Trainer::ResetOptimizer() { optimizer_.reset(); }

void Trainer::ConfigureOptimizer(const TrainOptions& o) {
  auto options_for = [&](bool decay) {
    FusedAdamW::Options options;
    options.learning_rate = o.learning_rate;
    options.beta1 = o.beta1;
    options.beta2 = o.beta2;
    options.eps = o.adam_eps;
    options.weight_decay = decay ? o.weight_decay : 0.0;
    return options;
  };
  if (optimizer_ == nullptr) {
    // Group 0: matrices and embeddings (decayed); group 1: RMSNorm weights.
    std::vector<at::Tensor> decay, no_decay;
    // Frozen parameters (placed on disk) stay out of the optimizer.
    for (const at::Tensor& p : model_->Parameters()) {
      if (p.requires_grad()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
    }
    optimizer_ = std::make_unique<FusedAdamW>(
        std::vector<std::vector<at::Tensor>>{std::move(decay), std::move(no_decay)},
        std::vector<FusedAdamW::Options>{options_for(true), options_for(false)});
    return;
  }
  optimizer_->set_options(0, options_for(true));
  optimizer_->set_options(1, options_for(false));
}

void Trainer::ClearGradients() {
  for (const at::Tensor& p : model_->Parameters()) {
    // set_to_none, as PyTorch's zero_grad(set_to_none=True): frees the memory.
    p.mutable_grad() = at::Tensor();
  }
}

absl::StatusOr<StepReport> Trainer::Step(const TrainOptions& options,
                                         const TokenDataset& data,
                                         at::Generator& generator) {
  RETURN_IF_ERROR(
      ValidateTrainOptions(options, model_->config().max_position_embeddings));
  RETURN_IF_ERROR(data.Validate(options.seq_len));
  return StepUnchecked(options, data, generator, 1);
}

absl::StatusOr<StepReport> Trainer::StepUnchecked(const TrainOptions& options,
                                                  const TokenDataset& data,
                                                  at::Generator& generator,
                                                  int64_t step_in_run) {
  const Clock::time_point start = Clock::now();
  model_->set_attention_implementation(options.attn_implementation);
  StepReport report;
  report.step = step_in_run;
  report.global_step = global_step_ + 1;
  report.tokens = options.batch_size * options.seq_len * options.grad_accumulation_steps;

  StepMarker marker(report.global_step);
  if (hooks_.before_step) hooks_.before_step(report.global_step);

  const int64_t vocab = model_->config().vocab_size;
  const c10::Device device = model_->device();
  double loss_sum = 0.0;
  absl::Status batch_status;  // a data error, carried out of the boundary
  absl::Status status = TorchBoundary("training step", [&] {
    ConfigureOptimizer(options);
    ClearGradients();
    for (int64_t micro = 0; micro < options.grad_accumulation_steps; ++micro) {
      absl::StatusOr<TokenBatch> batch =
          data.NextBatch(options.batch_size, options.seq_len, generator);
      if (!batch.ok()) {
        batch_status = batch.status();
        return;
      }
      at::Tensor inputs = batch->inputs.to(device);
      at::Tensor targets = batch->targets.to(device);

      at::Tensor loss;
      Clock::time_point t0 = Clock::now();
      {
        PhaseScope phase(Phase::kForward);
        at::Tensor hidden;
        {
          std::shared_ptr<void> scope = Enter(hooks_.body_scope);
          if (options.gradient_checkpointing) {
            hidden = model_->Embed(inputs);
            for (int64_t i = 0; i < model_->num_layers(); ++i) {
              hidden = CheckpointedLayer(*model_, i, hidden);
            }
            hidden = model_->FinalNorm(hidden);
          } else {
            hidden = model_->ForwardHidden(inputs);
          }
        }
        std::shared_ptr<void> scope = Enter(hooks_.head_scope);
        at::Tensor logits = model_->Head(hidden);
        loss = torch::nn::functional::cross_entropy(logits.view({-1, vocab}),
                                                    targets.view({-1}));
        if (options.grad_accumulation_steps > 1)
          loss = loss / static_cast<double>(options.grad_accumulation_steps);
      }
      if (hooks_.after_forward) hooks_.after_forward();
      Clock::time_point t1 = Clock::now();
      report.forward_seconds += std::chrono::duration<double>(t1 - t0).count();
      {
        PhaseScope phase(Phase::kBackward);
        loss.backward();
      }
      report.backward_seconds += SecondsSince(t1);
      loss_sum += loss.item<double>();
    }

    Clock::time_point t2 = Clock::now();
    PhaseScope phase(Phase::kOptimizer);
    std::vector<at::Tensor> norms;
    for (const at::Tensor& p : model_->Parameters()) {
      if (p.grad().defined()) norms.push_back(p.grad().norm());
    }
    double total = norms.empty() ? 0.0 : torch::stack(norms).norm().item<double>();
    report.grad_norm = total;
    if (options.max_grad_norm > 0 && total > options.max_grad_norm) {
      // torch.nn.utils.clip_grad_norm_'s coefficient.
      const double coef = options.max_grad_norm / (total + 1e-6);
      torch::NoGradGuard no_grad;
      for (const at::Tensor& p : model_->Parameters()) {
        if (p.grad().defined()) p.grad().mul_(coef);
      }
    }
    optimizer_->Step();
    report.optimizer_seconds = SecondsSince(t2);
  });
  if (!status.ok() && hooks_.on_failure) hooks_.on_failure(status, report.global_step);
  ClearGradients();
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(batch_status);

  ++global_step_;
  report.loss = loss_sum;
  report.step_seconds = SecondsSince(start);
  report.tokens_per_second =
      report.step_seconds > 0 ? static_cast<double>(report.tokens) / report.step_seconds
                              : 0;
  if (hooks_.after_step) hooks_.after_step(report);
  return report;
}

absl::StatusOr<TrainResult> Trainer::Run(
    const TrainOptions& options, const std::function<void(const StepReport&)>& on_step,
    const std::function<bool()>& cancelled) {
  RETURN_IF_ERROR(
      ValidateTrainOptions(options, model_->config().max_position_embeddings));
  ASSIGN_OR_RETURN(std::unique_ptr<TokenDataset> data,
                   TokenDataset::Create(options.data, model_->config().vocab_size));
  return Run(options, *data, on_step, cancelled);
}

absl::StatusOr<TrainResult> Trainer::Run(
    const TrainOptions& options, const TokenDataset& data,
    const std::function<void(const StepReport&)>& on_step,
    const std::function<bool()>& cancelled) {
  RETURN_IF_ERROR(
      ValidateTrainOptions(options, model_->config().max_position_embeddings));
  RETURN_IF_ERROR(data.Validate(options.seq_len));
  at::Generator generator = MakeDataGenerator(options.seed);

  TrainResult result;
  const Clock::time_point start = Clock::now();
  for (int64_t step = 1; step <= options.steps; ++step) {
    if (cancelled && cancelled()) {
      result.cancelled = true;
      break;
    }
    ASSIGN_OR_RETURN(StepReport report, StepUnchecked(options, data, generator, step));
    if (step == 1) result.first_loss = report.loss;
    result.last_loss = report.loss;
    result.steps_completed = step;
    result.tokens += report.tokens;
    if (on_step) on_step(report);
  }
  result.seconds = SecondsSince(start);
  result.mean_tokens_per_second =
      result.seconds > 0 ? static_cast<double>(result.tokens) / result.seconds : 0;
  result.global_step = global_step_;
  return result;
}

std::vector<at::Tensor> Trainer::OptimizerState() const {
  return optimizer_ ? optimizer_->State() : std::vector<at::Tensor>();
}

}  // namespace memprofd
