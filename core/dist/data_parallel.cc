#include "core/dist/data_parallel.h"

#include <ATen/ATen.h>

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/dist/model_sync.h"

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
    ASSIGN_OR_RETURN(sharding, OptimizerSharding::Create(group, model->NamedParameters(),
                                                         trainer->NamedOptimizerState()));
  }
  const std::vector<at::Tensor> parameters = model->Parameters();
  // kGradients and kFull: the gradients go to the ranks that own the
  // parameters; kFull: so do the parameters themselves.
  const bool full = options.sharding == Sharding::kFull;
  std::vector<int> owners;
  if (options.sharding == Sharding::kGradients || full) {
    for (const at::Tensor& p : parameters) owners.push_back(sharding->OwnerOf(p));
  }
  std::unique_ptr<ParameterSharding> params;
  if (full) {
    ASSIGN_OR_RETURN(params, ParameterSharding::Create(group, model, owners));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<GradientSync> sync,
      GradientSync::Create(group, parameters, options.bucket_bytes, std::move(owners)));
  if (params != nullptr) params->ReleaseAll();
  return std::unique_ptr<DataParallel>(
      new DataParallel(group, trainer, options.sharding, std::move(sync),
                       std::move(sharding), std::move(params)));
}

absl::Status DataParallel::GatherWholeModel() {
  return params_ != nullptr ? params_->GatherAll() : absl::OkStatus();
}

absl::Status DataParallel::ShardModel() {
  if (params_ != nullptr) params_->ReleaseAll();
  return absl::OkStatus();
}

absl::Status DataParallel::BeforeUnit(const ModelUnit& unit, bool backward) {
  return params_ != nullptr ? params_->Gather(unit, backward) : absl::OkStatus();
}

void DataParallel::AfterUnitForward(const ModelUnit& unit) {
  if (params_ != nullptr && unit.kind != ModelUnit::Kind::kHead) params_->Release(unit);
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

absl::Status DataParallel::AfterBackward() { return sync_->Finish(); }

absl::StatusOr<double> DataParallel::CombineGradNorm(double norm) {
  if (level_ != Sharding::kGradients && level_ != Sharding::kFull) return norm;
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

void DataParallel::BeforeUpdate() {
  if (sharding_ != nullptr) sharding_->DropForeignGradients();
  // kFull: what backward left gathered (a parameter that got no gradient)
  // goes too.
  if (params_ != nullptr) params_->ReleaseAll();
}

absl::Status DataParallel::AfterUpdate() {
  // kFull: the owner's parameter is the only copy; nothing to share.
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
        "full sharding keeps one copy of each parameter: there are no replicas to "
        "compare");
  }
  return ParameterDrift(*group_, trainer_->model()->NamedParameters());
}

}  // namespace memprofd
