#include "core/dist/data_parallel.h"

#include <ATen/ATen.h>

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/dist/model_sync.h"
#include "core/train/adamw.h"

namespace memprofd {

DataParallel::DataParallel(ProcessGroup* group, Trainer* trainer, Sharding level,
                           std::unique_ptr<GradientSync> sync,
                           std::unique_ptr<OptimizerSharding> sharding,
                           std::unique_ptr<ParameterSharding> params)
    : group_(group),
      trainer_(trainer),
      level_(level),
      sync_(std::move(sync)),
      sharding_(std::move(sharding)),
      params_(std::move(params)) {}

DataParallel::~DataParallel() = default;

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(
    ProcessGroup* group, Trainer* trainer, const DataParallelOptions& options) {
  LlamaModel* model = trainer->model();
  RETURN_IF_ERROR(TakeRankZeroParameters(*group, model->NamedParameters()));
  std::unique_ptr<OptimizerSharding> sharding;
  if (options.sharding == Sharding::kNone) {
    RETURN_IF_ERROR(TakeRankZeroOptimizerState(*group, trainer->NamedOptimizerState()));
  } else {
    ASSIGN_OR_RETURN(sharding, OptimizerSharding::Create(group, trainer));
  }
  // kFull: the parameters are kept as shards, which the optimizer updates.
  std::unique_ptr<ParameterSharding> params;
  if (options.sharding == Sharding::kFull) {
    ASSIGN_OR_RETURN(params, ParameterSharding::Create(group, model));
    const std::vector<at::Tensor> all = model->Parameters();
    for (size_t k = 0; k < all.size(); ++k) {
      if (!trainer->optimizer()->Retarget(all[k], params->PieceTarget(k))) {
        return absl::InternalError(
            absl::StrCat("full sharding: parameter ", k,
                         " has no optimizer slot of its piece's size"));
      }
    }
  }
  // kGradients and kFull: the gradients are reduce-scattered to the pieces,
  // unit by unit.
  std::unique_ptr<GradientSync> sync;
  if (options.sharding == Sharding::kGradients || options.sharding == Sharding::kFull) {
    const std::vector<at::Tensor>& trainable = sharding->parameters();
    std::vector<int> units(trainable.size(), -1);
    const std::vector<std::vector<size_t>> unit_indices =
        UnitParameterIndices(*model, trainable);
    for (size_t u = 0; u < unit_indices.size(); ++u) {
      for (size_t k : unit_indices[u]) {
        if (units[k] < 0) units[k] = static_cast<int>(u);  // a tied head: the embedding's
      }
    }
    ASSIGN_OR_RETURN(sync,
                     GradientSync::Create(group, trainable, options.bucket_bytes,
                                          sharding->PieceTargets(), std::move(units)));
  } else {
    ASSIGN_OR_RETURN(
        sync, GradientSync::Create(group, model->Parameters(), options.bucket_bytes));
  }
  if (params != nullptr) params->ReleaseAll();
  return std::unique_ptr<DataParallel>(
      new DataParallel(group, trainer, options.sharding, std::move(sync),
                       std::move(sharding), std::move(params)));
}

absl::Status DataParallel::Finish() {
  return params_ != nullptr ? params_->GatherAll() : absl::OkStatus();
}

absl::Status DataParallel::BeforeUnit(const ModelUnit& unit, bool backward) {
  return params_ != nullptr ? params_->Gather(unit, backward) : absl::OkStatus();
}

void DataParallel::AfterUnitForward(const ModelUnit& unit) {
  if (params_ == nullptr || unit.kind == ModelUnit::Kind::kHead) return;
  params_->Release(unit);
}

absl::Status DataParallel::BeforeEvaluation() {
  if (params_ != nullptr)
    evaluation_ = std::make_unique<ShardedEvaluation>(params_.get(), /*lead=*/false);
  return absl::OkStatus();
}

absl::Status DataParallel::AfterEvaluation() {
  evaluation_.reset();
  return absl::OkStatus();
}

std::optional<DataShard> DataParallel::data_shard() const {
  return DataShard{group_->rank(), group_->world_size()};
}

void DataParallel::OnStepBegin(int64_t /*global_step*/) {
  sync_->BeginStep();
  if (params_ != nullptr) params_->ResetPeak();
}

void DataParallel::BeforeBackward(bool last) {
  if (last || sync_->sharded()) sync_->Arm();
}

absl::Status DataParallel::AfterBackward() {
  RETURN_IF_ERROR(sync_->Finish());
  // kOptimizer: the gradients were averaged whole; the update reads the
  // pieces'.
  if (sharding_ != nullptr && !sync_->sharded()) sharding_->TakePieceGradients();
  return absl::OkStatus();
}

absl::StatusOr<double> DataParallel::CombineGradNorm(double norm) {
  // Sharded, each rank's norm is over its pieces: the global one is the
  // root of the ranks' sums of squares.
  if (level_ == Sharding::kNone) return norm;
  // A non-finite norm stays non-finite in the sum, so every rank skips.
  at::Tensor squares;
  RETURN_IF_ERROR(TorchBoundary("the global gradient norm", [&] {
    squares = at::tensor({norm * norm}, at::TensorOptions().dtype(at::kDouble))
                  .to(trainer_->model()->device());
  }));
  RETURN_IF_ERROR(group_->AllReduceSum(squares));
  // A plan's dry run (meta tensors, ProcessGroup::ForPlan) has no norm to
  // combine: the trainer's own stands, as unspecified as any meta value.
  if (squares.is_meta()) return norm;
  double sum = 0;
  RETURN_IF_ERROR(TorchBoundary("the global gradient norm",
                                [&] { sum = squares.cpu().item<double>(); }));
  return std::sqrt(sum);
}

absl::StatusOr<bool> DataParallel::AgreeOnUpdate(bool keep) {
  // Unsharded, every rank updates the same parameters from the same
  // averaged gradients, so each decides alike. Sharded, each rank saw only
  // its pieces: the update is kept when no rank refused it.
  if (level_ == Sharding::kNone) return keep;
  at::Tensor refusals;
  RETURN_IF_ERROR(TorchBoundary("agreeing on the update", [&] {
    refusals = at::tensor({keep ? 0.0 : 1.0}, at::TensorOptions().dtype(at::kDouble))
                   .to(trainer_->model()->device());
  }));
  RETURN_IF_ERROR(group_->AllReduceSum(refusals));
  if (refusals.is_meta()) return keep;  // a plan's dry run, as CombineGradNorm
  double sum = 0;
  RETURN_IF_ERROR(TorchBoundary("agreeing on the update",
                                [&] { sum = refusals.cpu().item<double>(); }));
  return sum == 0;
}

void DataParallel::BeforeUpdate() {
  // kFull: what backward left gathered (a parameter that got no gradient)
  // goes too.
  if (params_ != nullptr) params_->ReleaseAll();
}

absl::Status DataParallel::AfterUpdate() {
  // kFull: the shards are the only copy; nothing to share.
  if (sharding_ == nullptr || params_ != nullptr) return absl::OkStatus();
  return sharding_->ShareUpdatedParameters();
}

absl::Status DataParallel::OnStepEnd(StepReport& report) {
  // float64 on the model's device (NCCL reduces device tensors only): the
  // same three sums, in the same order, on every rank, so every rank derives
  // the same global loss.
  at::Tensor sums;
  RETURN_IF_ERROR(TorchBoundary("the global step report", [&] {
    sums = at::tensor({report.loss * static_cast<double>(report.tokens),
                       static_cast<double>(report.tokens), report.tokens_per_second},
                      at::TensorOptions().dtype(at::kDouble))
               .to(trainer_->model()->device());
  }));
  RETURN_IF_ERROR(group_->AllReduceSum(sums));
  if (sums.is_meta()) return absl::OkStatus();  // a plan's dry run: no values
  at::Tensor host;
  RETURN_IF_ERROR(TorchBoundary("the global step report", [&] { host = sums.cpu(); }));
  const double* s = host.const_data_ptr<double>();
  report.rank_loss = report.loss;
  report.loss = s[1] > 0 ? s[0] / s[1] : report.loss;
  report.tokens = static_cast<int64_t>(s[1]);
  report.tokens_per_second = s[2];
  return absl::OkStatus();
}

absl::StatusOr<double> DataParallel::Drift() {
  if (!replicated()) {
    return absl::FailedPreconditionError(
        "full sharding keeps one copy of each parameter, split over the ranks: there "
        "are no replicas to compare");
  }
  return ParameterDrift(*group_, trainer_->model()->NamedParameters());
}

}  // namespace memprofd
