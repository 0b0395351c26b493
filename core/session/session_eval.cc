// Session: evaluations, queued like snapshots so that one asked for during
// training runs between two steps, on the model as it stands then.

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/status_macros.h"
#include "core/model/llama.h"
#include "core/session/session.h"
#include "core/train/data.h"
#include "core/train/evaluate.h"
#include "core/train/trainer.h"

namespace memprofd {

absl::StatusOr<std::shared_ptr<Operation>> Session::StartEvaluation(
    const EvaluateRequest& request) {
  RETURN_IF_ERROR(CheckLeader("Evaluate"));
  std::optional<ModelSummary> model = Model();
  if (!model) {
    return absl::FailedPreconditionError("no model is loaded; LoadModel first");
  }
  ASSIGN_OR_RETURN(const EvalOptions options,
                   MergeEvaluateRequest(request, model->config.max_position_embeddings));
  // Read and checked here, as training data is: bad data is the caller's
  // error at once, not a failed operation.
  ASSIGN_OR_RETURN(std::shared_ptr<TokenDataset> data,
                   TokenDataset::Create(options.data, model->config.vocab_size));
  RETURN_IF_ERROR(data->Validate(options.seq_len));
  std::shared_ptr<Operation> op = operations_.Create(OperationKind::kEvaluate);
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    op->Finish(absl::UnavailableError("memprofd is shutting down"));
    return absl::UnavailableError(
        "memprofd is shutting down; retry against another instance");
  }
  boundary_.push_back([this, op, options, data] { RunEvaluation(op, options, *data); });
  // Wakes the owner thread when no training runs (see QueueSnapshot).
  queue_.push_back([] {});
  return op;
}

void Session::RunEvaluation(const std::shared_ptr<Operation>& op,
                            const EvalOptions& options, const TokenDataset& data) {
  if (op->cancel_requested()) {
    op->Finish(absl::CancelledError("cancelled before it started"));
    return;
  }
  if (!model_) {
    op->Finish(absl::FailedPreconditionError(
        "the model was unloaded before the evaluation ran; LoadModel first"));
    return;
  }
  op->MarkRunning();
  const int64_t batches =
      (EvalWindows(data, options) + options.batch_size - 1) / options.batch_size;
  op->SetProgress(0, batches, "batches", "evaluating");
  // The trainer sets the attention implementation of every step; restore
  // what it was so that an evaluation between two steps changes nothing.
  const AttentionImplementation attention = model_->attention_implementation();
  absl::StatusOr<EvalResult> result = EvaluateModel(*model_, data, options);
  model_->set_attention_implementation(attention);
  if (!result.ok()) {
    op->Finish(result.status());
    return;
  }
  result->global_step = trainer_ ? trainer_->global_step() : 0;
  op->SetProgress(
      batches, batches, "batches",
      absl::StrFormat("loss %.4f, perplexity %.2f", result->loss, result->perplexity));
  CountEvaluation(*result);
  op->Finish(absl::OkStatus(), *result);
}

void Session::CountEvaluation(const EvalResult& result) {
  absl::MutexLock lock(&mu_);
  counters_.evaluations_total += 1;
  counters_.last_eval = result;
}

}  // namespace memprofd
