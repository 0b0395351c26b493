#include "core/dist/data_parallel.h"

#include <utility>

#include "core/common/status_macros.h"
#include "core/dist/model_sync.h"

namespace memprofd {

DataParallel::DataParallel(ProcessGroup* group, Trainer* trainer,
                           std::unique_ptr<GradientSync> sync)
    : group_(group),
      trainer_(trainer),
      sync_(std::move(sync)),
      wrapped_(trainer->hooks()) {}

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Attach(ProcessGroup* group,
                                                                   Trainer* trainer,
                                                                   int64_t bucket_bytes) {
  LlamaModel* model = trainer->model();
  RETURN_IF_ERROR(TakeRankZeroParameters(*group, model->NamedParameters()));
  RETURN_IF_ERROR(TakeRankZeroOptimizerState(*group, trainer->NamedOptimizerState()));
  ASSIGN_OR_RETURN(std::unique_ptr<GradientSync> sync,
                   GradientSync::Create(group, model->Parameters(), bucket_bytes));
  std::unique_ptr<DataParallel> dp(new DataParallel(group, trainer, std::move(sync)));
  StepHooks hooks = dp->wrapped_;
  GradientSync* raw = dp->sync_.get();
  hooks.before_backward = [raw, inner = dp->wrapped_.before_backward](bool last) {
    if (inner) inner(last);
    if (last) raw->Arm();
  };
  hooks.after_backward = [raw, inner = dp->wrapped_.after_backward]() -> absl::Status {
    RETURN_IF_ERROR(raw->Finish());
    return inner ? inner() : absl::OkStatus();
  };
  trainer->set_hooks(std::move(hooks));
  trainer->set_data_shard({group->rank(), group->world_size()});
  return dp;
}

DataParallel::~DataParallel() {
  trainer_->set_hooks(wrapped_);
  trainer_->set_data_shard({});
}

absl::StatusOr<double> DataParallel::Drift() {
  return ParameterDrift(*group_, trainer_->model()->NamedParameters());
}

}  // namespace memprofd
