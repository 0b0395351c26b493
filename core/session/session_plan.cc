// Session: memory plans (PLAN operations), run on the plan thread beside
// whatever the owner thread is doing. The checks of a plan request live
// here, once; the dry run is core/plan/planner.h's.

#include <memory>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "core/common/log.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/dist/sharding.h"
#include "core/memory/oom_report.h"
#include "core/memory/recorder.h"
#include "core/plan/budget.h"
#include "core/plan/planner.h"
#include "core/session/model_host.h"
#include "core/session/owner_thread.h"
#include "core/session/plan_support.h"
#include "core/session/runtime.h"
#include "core/session/session.h"
#include "core/session/training_data.h"
#include "core/train/data.h"

namespace memprofd {
namespace {

// `base` with the model and the training a plan of `config` runs: the
// request's training fields merged over TrainOptions' defaults by
// MergeTrainOverrides, the one check of a training request. A plan runs no
// steps of the request, so steps may be left unset (the default count is
// then checked, as the schedule's fields are checked against it).
absl::StatusOr<plan::PlanSpec> WithModel(plan::PlanSpec base, const LlamaConfig& config,
                                         TrainOverrides train) {
  const TrainOptions defaults;
  if (!train.steps) train.steps = defaults.steps;
  ASSIGN_OR_RETURN(const ValidTrainOptions valid,
                   MergeTrainOverrides(defaults, train, config.max_position_embeddings));
  base.model = config;
  base.train = valid.get();
  base.data_bytes = PlannedDataBytes(base.train);
  return base;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Operation>> Session::StartPlan(
    const PlanMemorySpec& spec) {
  if (!spec.preset.empty() && !spec.hf_config_dir.empty()) {
    return absl::InvalidArgumentError(
        "give at most one model to plan: a preset or hf_config_dir (neither: the "
        "loaded model)");
  }
  if (spec.train.resume) {
    return absl::InvalidArgumentError(
        "train.resume: a plan does not resume a run; give the training fields to plan "
        "instead");
  }
  plan::PlanSpec base;
  // The compute device's type ("cuda:0" is a cuda target).
  if (spec.target) {
    ASSIGN_OR_RETURN(base.target, plan::ParseTarget(*spec.target));
  } else {
    base.target = TargetOf(device_);
  }
  base.capacity_bytes = spec.capacity_bytes.value_or(0);
  if (base.capacity_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity_bytes must be >= 0 (0: no verdict), got ", base.capacity_bytes));
  }
  base.world_size = spec.world_size.value_or(base.world_size);
  if (spec.sharding) {
    absl::StatusOr<Sharding> sharding = ParseSharding(*spec.sharding);
    if (!sharding.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharding: ", sharding.status().message()));
    }
    base.sharding = *sharding;
  }
  RETURN_IF_ERROR(plan::CheckDataParallelPlan(base));
  ASSIGN_OR_RETURN(base.offload,
                   offload::MergeOffloadOverrides(options_.offload, spec.train.offload));
  // The model's shape when it is known now; a directory's config.json is
  // read on the plan thread, never on the caller's.
  std::string model_name;
  bool ready = false;
  if (!spec.preset.empty()) {
    ASSIGN_OR_RETURN(const LlamaConfig config, LlamaConfig::Preset(spec.preset));
    ASSIGN_OR_RETURN(base, WithModel(std::move(base), config, spec.train.train));
    model_name = absl::StrCat("preset:", spec.preset);
    ready = true;
  } else if (spec.hf_config_dir.empty()) {
    std::optional<ModelSummary> model = Model();
    if (!model) {
      return absl::FailedPreconditionError(
          "no model is loaded to plan for; LoadModel first, or name a preset or "
          "hf_config_dir");
    }
    ASSIGN_OR_RETURN(base, WithModel(std::move(base), model->config, spec.train.train));
    base.model_base_dtype = model->base_dtype;
    model_name = model->source;
    ready = true;
  } else {
    model_name = spec.hf_config_dir;
  }
  std::shared_ptr<Operation> op;
  {
    absl::MutexLock lock(&mu_);
    if (draining()) {
      return absl::UnavailableError(
          "memprofd is shutting down; retry against another instance, or once it is "
          "back");
    }
    if (!plan_active_.empty()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a memory plan is queued or running (operation ", plan_active_,
                       "); one runs at a time: wait for it (WaitOperation) and retry"));
    }
    ASSIGN_OR_RETURN(op, operations_.Admit(OperationKind::kPlan));
    plan_active_ = op->id();
    absl::Status posted = plans_->Post([this, op, spec, base, ready, model_name] {
      RunPlan(op, spec, base, ready, model_name);
    });
    if (!posted.ok()) {
      plan_active_.clear();
      op->Finish(absl::UnavailableError("memprofd is shutting down"));
      return posted;
    }
  }
  return op;
}

void Session::RunPlan(const std::shared_ptr<Operation>& op, const PlanMemorySpec& spec,
                      plan::PlanSpec base, bool ready, const std::string& model_name) {
  // Cleared before the operation is finished, so that a client that sees it
  // done may start the next plan at once.
  auto finish = [&](absl::Status status, OperationResult result = {}) {
    {
      absl::MutexLock lock(&mu_);
      plan_active_.clear();
    }
    op->Finish(std::move(status), std::move(result));
  };
  if (op->cancel_requested()) {
    finish(absl::CancelledError("cancelled before it started"));
    return;
  }
  op->MarkRunning();
  const PlanClock clock(op, options_.max_plan_time);
  absl::StatusOr<plan::PlanSpec> planned = std::move(base);
  if (!ready) {
    op->SetProgress(0, 1, "plans", "reading config.json");
    absl::StatusOr<LlamaConfig> config =
        host_->ReadClientConfig(spec.hf_config_dir, "hf_config_dir");
    planned = config.ok() ? WithModel(*std::move(planned), *config, spec.train.train)
                          : absl::StatusOr<plan::PlanSpec>(config.status());
  }
  if (!planned.ok()) {
    finish(planned.status());
    return;
  }
  // The data sources are checked as a Train checks them (confined, opened,
  // every id in the vocabulary, long enough for seq_len), here on the plan
  // thread; the plan itself draws from a synthetic window.
  op->SetProgress(0, 1, "plans", "checking the data sources");
  if (absl::StatusOr<TrainingData> data =
          ReadTrainingData(planned->train, planned->model.vocab_size, std::nullopt,
                           ClientDataAccess(data_roots_, options_, op));
      !data.ok()) {
    finish(data.status());
    return;
  }
  op->SetProgress(0, 1, "plans", "planning one training step on the meta device");
  // A client's cancel, a drain (RequestDrain) and the cap stop the dry run
  // within a layer's work.
  planned->cancelled = clock.StopWhen();
  absl::StatusOr<plan::MemoryPlan> plan = PlanGuarded<plan::MemoryPlan>(
      "memory plan", [&] { return plan::PlanTrainingStep(*planned); });
  if (!plan.ok()) {
    finish(clock.Explain(plan.status(), "the memory plan"));
    return;
  }
  if (op->cancel_requested()) {
    finish(
        absl::CancelledError("cancelled as its plan was finished; the plan was dropped"));
    return;
  }
  op->SetProgress(
      1, 1, "plans",
      absl::StrFormat("peak %d bytes in %s", plan->peak_allocated_bytes,
                      plan::PeakPhaseName(plan->peak_phase, plan->peak_at_setup)));
  finish(absl::OkStatus(), PlanResult{model_name, planned->target, *std::move(plan)});
}

}  // namespace memprofd
