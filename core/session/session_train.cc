// Session: the door of training operations (the rest is Training's,
// training.h) and how the session reads the data a request names
// (training_data.h).

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/session/model_host.h"
#include "core/session/rank_coordinator.h"
#include "core/session/session.h"
#include "core/session/training.h"
#include "core/session/training_data.h"
#include "core/train/data.h"

namespace memprofd {

bool NamesFile(const DataSpec& spec) {
  return spec.kind == DataSpec::Kind::kTextFile ||
         spec.kind == DataSpec::Kind::kTokenFile ||
         spec.kind == DataSpec::Kind::kIndexedDataset;
}

DataAccess ClientDataAccess(const PathRoots& roots, const SessionOptions& options,
                            const std::shared_ptr<Operation>& op) {
  DataAccess access;
  access.roots = &roots;
  access.max_file_bytes = options.max_data_file_bytes;
  if (op != nullptr) access.cancelled = [op] { return op->cancel_requested(); };
  return access;
}

absl::StatusOr<TrainingData> ReadTrainingData(const TrainOptions& train,
                                              int64_t vocab_size,
                                              std::optional<int64_t> resumed_tokens,
                                              const DataAccess& access) {
  TrainingData out;
  ASSIGN_OR_RETURN(out.data, TokenDataset::Create(train.data, vocab_size, access));
  RETURN_IF_ERROR(out.data->Validate(train.seq_len));
  if (resumed_tokens && out.data->size() != *resumed_tokens) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the run to resume read ", *resumed_tokens,
        " tokens from its data source, which now has ", out.data->size(),
        ": the data changed, so the run cannot go on on the same stream; restore the "
        "data, or give a data source and accept a new stream"));
  }
  if (train.eval_data) {
    absl::StatusOr<std::unique_ptr<TokenDataset>> created =
        TokenDataset::Create(*train.eval_data, vocab_size, access);
    absl::Status s =
        created.ok() ? (*created)->Validate(train.seq_len) : created.status();
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("eval_data: ", s.message()));
    out.eval_data = *std::move(created);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<Operation>> Session::StartTraining(const TrainSpec& spec) {
  RETURN_IF_ERROR(ranks_->CheckLeader("Train"));
  if (spec.memory_budget_bytes) {
    if (*spec.memory_budget_bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory_budget_bytes must be > 0, got ", *spec.memory_budget_bytes));
    }
    if (spec.resume) {
      return absl::UnimplementedError(
          "memory_budget_bytes with resume: a resumed run keeps its own batch_size and "
          "grad_accumulation_steps (its data stream goes on with them), so there is "
          "nothing to choose; resume without a budget, or train a new run under it");
    }
  }
  std::optional<ModelSummary> model = Model();
  if (!model) {
    return absl::FailedPreconditionError("no model is loaded; LoadModel first");
  }
  TrainOptions defaults;
  TrainOverrides request = spec.train;
  std::optional<RunState> run;
  if (spec.resume) {
    run = host_->Run();
    if (!run) {
      return absl::FailedPreconditionError(
          "there is no training run to resume on this model: load a checkpoint with "
          "resume (LoadModel with resume, or the daemon's resume option at start) or "
          "train "
          "without resume");
    }
    // The generator goes on from its saved state: another seed could not
    // take effect, so it is refused rather than ignored.
    if (request.seed && *request.seed != run->options.seed) {
      return absl::InvalidArgumentError(
          absl::StrCat("seed ", *request.seed,
                       " cannot be given with resume: the run's data stream "
                       "(seed ",
                       run->options.seed,
                       ") goes on from its saved generator state; drop "
                       "seed, or train without resume to start a new stream"));
    }
    // The checkpointed run's configuration fills what the request leaves
    // unset; by default the run goes on to its own total.
    defaults = run->options;
    if (!request.steps) {
      const int64_t rest = run->options.steps - run->steps_completed;
      if (rest < 1) {
        return absl::FailedPreconditionError(
            absl::StrCat("the run to resume is complete (", run->steps_completed, " of ",
                         run->options.steps, " steps); give steps to train further"));
      }
      request.steps = rest;
    }
  }
  // The one check of the request: what runs is this ValidTrainOptions.
  ASSIGN_OR_RETURN(
      const ValidTrainOptions valid,
      MergeTrainOverrides(defaults, request, model->config.max_position_embeddings));
  const TrainOptions& train = valid.get();
  ASSIGN_OR_RETURN(const offload::OffloadOptions offload_options,
                   offload::MergeOffloadOverrides(options_.offload, spec.offload));
  // Data in the request (inline tokens, the embedded corpus) is checked
  // here, so that its errors come back at once. Files are read in the
  // operation, on the owner thread: a large one takes seconds to check and
  // must not hold one of gRPC's few threads; a missing file or an
  // out-of-range id there fails the operation with the same status.
  std::optional<int64_t> resumed_tokens;
  if (run && !request.data) resumed_tokens = run->data_tokens;
  const int64_t vocab_size = model->config.vocab_size;
  std::optional<TrainingData> in_request;
  if (!NamesFile(train.data) && !(train.eval_data && NamesFile(*train.eval_data))) {
    ASSIGN_OR_RETURN(in_request,
                     ReadTrainingData(train, vocab_size, resumed_tokens, DataAccess()));
  }
  Training::Admitted admitted(valid);
  admitted.config = model->config;
  admitted.base_dtype = model->base_dtype;
  admitted.offload = offload_options;
  admitted.offload_request = spec.offload;
  admitted.budget_bytes = spec.memory_budget_bytes;
  admitted.resume = spec.resume;
  admitted.resumed_tokens = resumed_tokens;
  admitted.in_request = std::move(in_request);
  absl::MutexLock lock(&mu_);
  // Draining comes first: the training that still runs is being stopped,
  // so "another is running" would send the caller to wait for nothing.
  if (draining()) {
    return absl::UnavailableError(
        "memprofd is shutting down; retry against another instance, or once it is "
        "back");
  }
  // The training's place, held from here, through admission, to the run's
  // end (or given back at once if the operation is refused).
  ASSIGN_OR_RETURN(admitted.ticket, training_slot_.Take());
  ASSIGN_OR_RETURN(admitted.op, operations_.Admit(OperationKind::kTrain));
  std::shared_ptr<Operation> op = admitted.op;
  // Shutdown may have begun since the check above: then Admit finishes the
  // operation and says so.
  RETURN_IF_ERROR(training_->Admit(std::move(admitted)));
  return op;
}

}  // namespace memprofd
