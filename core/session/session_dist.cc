// Session: its side of data parallel. The protocol between the ranks, their
// threads and the run's state are the RankCoordinator's
// (rank_coordinator.h); here the session aligns its model with rank 0's and
// queues what a follower is told to run on its owner thread.

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/log.h"
#include "core/common/option_status.h"
#include "core/common/status_macros.h"
#include "core/dist/model_sync.h"
#include "core/dist/process_group.h"
#include "core/model/llama.h"
#include "core/session/model_host.h"
#include "core/session/optimizer_shards.h"
#include "core/session/owner_thread.h"
#include "core/session/rank_coordinator.h"
#include "core/session/session.h"
#include "core/session/training.h"
#include "core/session/training_data.h"
#include "core/train/data.h"
#include "core/train/trainer.h"

namespace memprofd {

const WorldSpec& Session::world() const { return ranks_->world(); }

bool Session::follower() const { return ranks_->follower(); }

void Session::SetFatalHandler(std::function<void(const absl::Status&)> handler) {
  ranks_->SetFatalHandler(std::move(handler));
}

std::optional<absl::Status> Session::fatal_status() const {
  return ranks_->fatal_status();
}

absl::StatusOr<MemoryAcrossRanks> Session::MemoryOfAllRanks() const {
  return ranks_->MemoryOfAllRanks();
}

absl::Status Session::AlignWithRankZero() {
  // JoinRun checked that every rank uses this level.
  counters_.Update(
      [&](SessionCounters& c) { c.data_parallel.sharding = options_.sharding; });
  // Every rank was started with the same --model (or resumed from the same
  // checkpoint): the check fails naming the first rank that was not.
  if (host_->model() == nullptr) return absl::OkStatus();
  ProcessGroup& group = *ranks_->group();
  RETURN_IF_ERROR(TakeRankZeroParameters(group, host_->model()->NamedParameters()));
  // Sharded, each rank holds its own pieces.
  if (!OptimizerStateSharded(options_)) {
    RETURN_IF_ERROR(
        TakeRankZeroOptimizerState(group, host_->trainer()->NamedOptimizerState()));
  }
  host_->PublishModel();
  return absl::OkStatus();
}

absl::Status Session::FollowLoad(const LoadModelSpec& spec) {
  std::shared_ptr<Operation> op = operations_.Create(OperationKind::kLoadModel);
  return Post([this, op, spec] {
    op->MarkRunning();
    // Whole first, with rank 0 (Session::LoadModel).
    if (absl::Status whole = training_->MakeModelWhole(); !whole.ok()) {
      op->Finish(whole);
      ranks_->FailRun(whole);
      return;
    }
    absl::Status status = host_->Load(spec);
    // A follower that could not load as rank 0 did holds another model:
    // the next Train's check names it.
    if (!status.ok()) {
      LogError(absl::StrCat("following rank 0's LoadModel: ", status.ToString()));
    }
    op->Finish(status, status.ok() ? OperationResult(*Model()) : OperationResult());
  });
}

absl::Status Session::FollowTrain(const TrainOptions& train,
                                  const offload::OffloadOverrides& offload_request,
                                  bool resume) {
  ASSIGN_OR_RETURN(const offload::OffloadOptions offload_options,
                   offload::MergeOffloadOverrides(options_.offload, offload_request));
  std::optional<ModelSummary> model = Model();
  if (!model) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", options_.world.rank,
        " has no model to follow rank 0's Train with: start every rank with the same "
        "model option"));
  }
  // Rank 0 checked them; this process checks what it received, once.
  ASSIGN_OR_RETURN(
      const ValidTrainOptions valid,
      ValidTrainOptions::Check(train, model->config.max_position_embeddings));
  // This rank reads the data itself (the same file, or the same generated
  // tokens); a rank that cannot must not leave rank 0 waiting.
  auto read = [&](const DataSpec& spec,
                  const char* what) -> absl::StatusOr<std::shared_ptr<TokenDataset>> {
    absl::StatusOr<std::unique_ptr<TokenDataset>> data = TokenDataset::Create(
        spec, model->config.vocab_size, ClientDataAccess(data_roots_, options_, nullptr));
    absl::Status s = data.ok() ? (*data)->Validate(train.seq_len) : data.status();
    if (!s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("rank ", options_.world.rank, " cannot read rank 0's ",
                                 what, ": ", s.message()));
    }
    return std::shared_ptr<TokenDataset>(*std::move(data));
  };
  ASSIGN_OR_RETURN(std::shared_ptr<TokenDataset> data, read(train.data, "training data"));
  std::shared_ptr<TokenDataset> eval_data;
  if (train.eval_data) {
    ASSIGN_OR_RETURN(eval_data, read(*train.eval_data, "eval_data"));
  }
  absl::MutexLock lock(&mu_);
  if (owner_->stopping()) return absl::CancelledError("shutting down");
  std::shared_ptr<TrainingSlot::Ticket> ticket = training_slot_.TakeInTurn();
  std::shared_ptr<Operation> op = operations_.Create(OperationKind::kTrain);
  if (!training_->Follow(op, ticket, valid, offload_options, {data, eval_data}, resume)
           .ok()) {
    // Shutdown began since the check above.
    return absl::CancelledError("shutting down");
  }
  return absl::OkStatus();
}

}  // namespace memprofd
