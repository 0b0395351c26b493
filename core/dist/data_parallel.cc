#include "core/dist/data_parallel.h"

#include <ATen/ATen.h>

#include <utility>

#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/dist/model_sync.h"

namespace memprofd {

DataParallel::DataParallel(ProcessGroup* group, Trainer* trainer,
                           std::unique_ptr<GradientSync> sync)
    : group_(group), trainer_(trainer), sync_(std::move(sync)) {}

DataParallel::~DataParallel() = default;

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(ProcessGroup* group,
                                                                   Trainer* trainer,
                                                                   int64_t bucket_bytes) {
  LlamaModel* model = trainer->model();
  RETURN_IF_ERROR(TakeRankZeroParameters(*group, model->NamedParameters()));
  RETURN_IF_ERROR(TakeRankZeroOptimizerState(*group, trainer->NamedOptimizerState()));
  ASSIGN_OR_RETURN(std::unique_ptr<GradientSync> sync,
                   GradientSync::Create(group, model->Parameters(), bucket_bytes));
  return std::unique_ptr<DataParallel>(new DataParallel(group, trainer, std::move(sync)));
}

std::optional<DataShard> DataParallel::data_shard() const {
  return DataShard{group_->rank(), group_->world_size()};
}

void DataParallel::BeforeBackward(bool last) {
  if (last) sync_->Arm();
}

absl::Status DataParallel::AfterBackward() { return sync_->Finish(); }

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
  return ParameterDrift(*group_, trainer_->model()->NamedParameters());
}

}  // namespace memprofd
