// Session: evaluations, queued like snapshots so that one asked for during
// training runs between two steps, on the model as it stands then.

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/status_macros.h"
#include "core/model/llama.h"
#include "core/session/model_host.h"
#include "core/session/rank_coordinator.h"
#include "core/session/session.h"
#include "core/session/snapshot_scheduler.h"
#include "core/session/training_data.h"
#include "core/train/data.h"
#include "core/train/evaluate.h"
#include "core/train/trainer.h"

namespace memprofd {

absl::StatusOr<std::shared_ptr<Operation>> Session::StartEvaluation(
    const EvalSpec& request) {
  RETURN_IF_ERROR(ranks_->CheckLeader("Evaluate"));
  std::optional<ModelSummary> model = Model();
  if (!model) {
    return absl::FailedPreconditionError("no model is loaded; LoadModel first");
  }
  ASSIGN_OR_RETURN(const EvalOptions options,
                   MergeEvalSpec(request, model->config.max_position_embeddings));
  // Data in the request is checked here; a file is read when the evaluation
  // runs, on the owner thread (as training data is), and bad data there
  // fails the operation.
  std::shared_ptr<TokenDataset> data;
  if (!NamesFile(options.data)) {
    ASSIGN_OR_RETURN(data, TokenDataset::Create(options.data, model->config.vocab_size));
    RETURN_IF_ERROR(data->Validate(options.seq_len));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Operation> op,
                   operations_.Admit(OperationKind::kEvaluate));
  // The boundary queue wakes the owner thread when no training runs.
  absl::Status queued = snapshots_->QueueBoundaryWork(
      [this, op, options, data] { RunEvaluation(op, options, data); });
  if (!queued.ok()) {
    op->Finish(absl::UnavailableError("memprofd is shutting down"));
    return absl::UnavailableError(
        "memprofd is shutting down; retry against another instance");
  }
  return op;
}

void Session::RunEvaluation(const std::shared_ptr<Operation>& op,
                            const EvalOptions& options,
                            std::shared_ptr<const TokenDataset> in_request) {
  if (op->cancel_requested()) {
    op->Finish(absl::CancelledError("cancelled before it started"));
    return;
  }
  LlamaModel* const model = host_->model();
  if (model == nullptr) {
    op->Finish(absl::FailedPreconditionError(
        "the model was unloaded before the evaluation ran; LoadModel first"));
    return;
  }
  op->MarkRunning();
  std::shared_ptr<const TokenDataset> read = std::move(in_request);
  if (read == nullptr) {
    op->SetProgress(0, 0, "batches", "reading the data");
    absl::StatusOr<std::unique_ptr<TokenDataset>> created =
        TokenDataset::Create(options.data, model->config().vocab_size,
                             ClientDataAccess(data_roots_, options_, op));
    absl::Status valid =
        created.ok() ? (*created)->Validate(options.seq_len) : created.status();
    if (!valid.ok()) {
      op->Finish(valid);
      return;
    }
    read = *std::move(created);
  }
  const TokenDataset& data = *read;
  const int64_t batches = EvalBatches(data, options);
  op->SetProgress(0, batches, "batches", "evaluating");
  // The trainer sets the attention implementation of every step; restore
  // what it was so that an evaluation between two steps changes nothing.
  const AttentionImplementation attention = model->attention_implementation();
  // At a step boundary of a fully sharded run, every rank gathers the
  // model's units with this one, one at a time.
  absl::StatusOr<EvalResult> result = absl::UnknownError("not evaluated");
  if (absl::StatusOr<std::unique_ptr<EvalUnits>> units = ranks_->EvaluationUnits();
      !units.ok()) {
    result = units.status();
  } else {
    result = EvaluateModel(
        *model, data, options, [&op] { return op->cancel_requested(); }, units->get());
  }
  model->set_attention_implementation(attention);
  if (!result.ok()) {
    op->Finish(result.status());
    return;
  }
  const Trainer* const trainer = host_->trainer();
  result->global_step = trainer ? trainer->global_step() : 0;
  op->SetProgress(
      batches, batches, "batches",
      absl::StrFormat("loss %.4f, perplexity %.2f", result->loss, result->perplexity));
  counters_.CountEvaluation(*result);
  op->Finish(absl::OkStatus(), *result);
}
}  // namespace memprofd
