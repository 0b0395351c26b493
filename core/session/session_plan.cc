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
#include "core/session/runtime.h"
#include "core/session/session.h"
#include "core/session/training_data.h"
#include "core/train/data.h"

namespace memprofd {
namespace {

// The device a plan targets when the request names none: the session's
// (a device string such as "cpu" or "cuda:0").
plan::PlanSpec::Target TargetOf(absl::string_view device) {
  return absl::StartsWith(device, "cuda") ? plan::PlanSpec::Target::kCuda
                                          : plan::PlanSpec::Target::kCpu;
}

// What a run of `train` keeps of its data in the allocator
// (plan::PlanSpec::data_bytes): its training and evaluation tokens held in
// memory.
int64_t PlannedDataBytes(const TrainOptions& train) {
  return InMemoryTokenBytes(train.data) +
         (train.eval_data ? InMemoryTokenBytes(*train.eval_data) : 0);
}

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

// fn() on the plan thread, where the planner runs LibTorch: nothing it
// throws may end the thread (and the daemon) instead of the operation, so a
// throw comes back as TorchBoundary's status, named `what`.
template <typename T>
absl::StatusOr<T> PlanGuarded(absl::string_view what,
                              absl::FunctionRef<absl::StatusOr<T>()> fn) {
  absl::StatusOr<T> out = absl::InternalError(absl::StrCat(what, " did not run"));
  if (absl::Status thrown = TorchBoundary(what, [&] { out = fn(); }); !thrown.ok()) {
    out = thrown;
  }
  return out;
}

// When a plan stops (PlanSpec::cancelled): its operation was cancelled (by
// its client, or a drain), or it ran past the daemon's wall-clock cap on a
// plan (SessionOptions::max_plan_time), counted from when it starts.
class PlanClock {
 public:
  PlanClock(std::shared_ptr<Operation> op, absl::Duration cap)
      : op_(std::move(op)), cap_(cap), deadline_(absl::Now() + cap) {}

  std::function<bool()> StopWhen() const {
    return [op = op_, deadline = deadline_] {
      return op->cancel_requested() || absl::Now() >= deadline;
    };
  }

  // A plan's failure as its client reads it: one the cap stopped (the
  // planner says CANCELLED) is DEADLINE_EXCEEDED naming the cap.
  absl::Status Explain(absl::Status status, absl::string_view what) const {
    if (!absl::IsCancelled(status) || op_->cancel_requested() ||
        absl::Now() < deadline_) {
      return status;
    }
    return absl::DeadlineExceededError(absl::StrCat(
        what, " ran past the daemon's cap on a plan (max_plan_time, ",
        absl::FormatDuration(cap_),
        ") and was stopped: plan a smaller model or configuration, or raise the cap"));
  }

 private:
  const std::shared_ptr<Operation> op_;
  const absl::Duration cap_;
  const absl::Time deadline_;
};

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
  op->SetProgress(1, 1, "plans",
                  absl::StrFormat("peak %d bytes in %s", plan->peak_allocated_bytes,
                                  PhaseName(plan->peak_phase)));
  finish(absl::OkStatus(), PlanResult{model_name, planned->target, *std::move(plan)});
}

namespace {

// The plan of a training step of `config` as this session's device runs it,
// on each rank of its data-parallel run (one process: world 1).
plan::PlanSpec TrainingPlanSpec(const std::string& device, const SessionOptions& options,
                                const LlamaConfig& config, const ValidTrainOptions& train,
                                const offload::OffloadOptions& offload) {
  plan::PlanSpec spec;
  spec.model = config;
  spec.train = train.get();
  spec.offload = offload;
  spec.target = TargetOf(device);
  spec.world_size = options.world.world_size;
  spec.sharding = options.sharding;
  spec.data_bytes = PlannedDataBytes(spec.train);
  return spec;
}

}  // namespace

int64_t Session::OwnPlannedPeak(const plan::MemoryPlan& planned) const {
  for (const plan::RankPlan& rank : planned.ranks) {
    if (rank.rank == options_.world.rank) return rank.peak_allocated_bytes;
  }
  return planned.peak_allocated_bytes;
}

absl::Status Session::StepFits(const plan::MemoryPlan& planned) const {
  const int64_t peak = OwnPlannedPeak(planned);
  const int device = host_->recorder_device();
  const memory::DeviceRoom room = memory::QueryDeviceRoom(device);
  if (room.free_bytes < 0) return absl::OkStatus();  // nothing known to compare with
  // What the device holds for this process now (the model, any optimizer
  // state) is inside the plan's peak and no longer free.
  int64_t held = 0;
  for (const memory::DeviceMemoryStats& d : runtime_.recorder().Stats().devices) {
    if (d.index == device) held = d.current_bytes;
  }
  const int64_t more = peak - held;
  if (more <= room.free_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "its step is planned to peak at %d bytes%s, %d more than this process holds now, "
      "and the %s device has %d bytes free; lower batch_size or seq_len, set "
      "gradient_checkpointing or offloading, or give memory_budget_bytes",
      peak,
      planned.world_size > 1 ? absl::StrCat(" on rank ", options_.world.rank)
                             : std::string(),
      more, device_, room.free_bytes));
}

void Session::CalibrateRun(const std::shared_ptr<Operation>& op,
                           const std::shared_ptr<TrainingSlot::Ticket>& ticket,
                           const LlamaConfig& config, const ValidTrainOptions& train,
                           const offload::OffloadOptions& offload,
                           const std::shared_ptr<TrainingPlan>& plan,
                           const StartRun& start) {
  if (!op->done() && !op->cancel_requested() && !plans_->stopping()) {
    plan::PlanSpec spec = TrainingPlanSpec(device_, options_, config, train, offload);
    // A training cancelled meanwhile stops its plan between layers, so that
    // the next training's calibration, queued behind it, runs at once; so
    // does the cap on a plan.
    const PlanClock clock(op, options_.max_plan_time);
    spec.cancelled = clock.StopWhen();
    // Admission: a step beyond the plan's size admission, or whose planned
    // peak cannot fit what the device has free, is refused before the run
    // allocates anything. A plan that fails otherwise leaves the run
    // unplanned (logged below), never refused.
    absl::Status admitted = plan::CheckPlanSize(spec);
    absl::StatusOr<plan::MemoryPlan> planned =
        admitted.ok()
            ? PlanGuarded<plan::MemoryPlan>("calibration plan",
                                            [&] { return plan::PlanTrainingStep(spec); })
            : absl::StatusOr<plan::MemoryPlan>(admitted);
    if (planned.ok()) admitted = StepFits(*planned);
    // A plan the cap stopped decided nothing: the run is not admitted.
    const absl::Status explained =
        clock.Explain(planned.status(), "the plan that admits the training");
    if (absl::IsDeadlineExceeded(explained)) admitted = explained;
    if (options_.refuse_unfit_steps && !admitted.ok()) {
      ticket->Finish(
          op,
          absl::Status(admitted.code(), absl::StrCat("the training was refused before it "
                                                     "allocated anything: ",
                                                     admitted.message())),
          TrainResult{});
      return;
    }
    if (planned.ok()) {
      plan->planned_peak_bytes.store(OwnPlannedPeak(*planned));
    } else if (!op->cancel_requested()) {
      // The run goes on unplanned (its reports' planned_peak_bytes stay 0,
      // "not planned"); the log says why, so that no plan fails unseen.
      LogWarning(absl::StrCat(
          "training operation ", op->id(),
          " runs without a calibration plan: ", planned.status().ToString()));
    }
  }
  if (absl::Status posted = start(train, offload); !posted.ok()) {
    ticket->Finish(op, std::move(posted), TrainResult{});
  }
}

void Session::PlanUnderBudget(const std::shared_ptr<Operation>& op,
                              const std::shared_ptr<TrainingSlot::Ticket>& ticket,
                              const LlamaConfig& config, const ValidTrainOptions& train,
                              const offload::OffloadOptions& offload,
                              int64_t budget_bytes,
                              const std::shared_ptr<TrainingPlan>& plan,
                              const StartRun& start) {
  auto fail = [&](absl::Status status) {
    ticket->Finish(op, std::move(status), TrainResult{});
  };
  if (op->cancel_requested()) {
    fail(absl::CancelledError("cancelled before it started"));
    return;
  }
  op->SetProgress(
      0, train->steps, "steps",
      absl::StrFormat("choosing a configuration under %d bytes", budget_bytes));
  plan::PlanSpec base = TrainingPlanSpec(device_, options_, config, train, offload);
  const PlanClock clock(op, options_.max_plan_time);
  base.cancelled = clock.StopWhen();
  absl::StatusOr<plan::BudgetChoice> choice = PlanGuarded<plan::BudgetChoice>(
      "memory budget plan", [&] { return plan::ChooseUnderBudget(base, budget_bytes); });
  if (!choice.ok()) {
    fail(clock.Explain(choice.status(), "the memory budget's plans"));
    return;
  }
  if (op->cancel_requested()) {
    fail(absl::CancelledError("cancelled while its configuration was planned"));
    return;
  }
  // The chosen options went through the one check again: they differ from
  // the request's in fields the planner may have set.
  absl::StatusOr<ValidTrainOptions> chosen =
      ValidTrainOptions::Check(choice->spec.train, config.max_position_embeddings);
  if (!chosen.ok()) {
    fail(chosen.status());
    return;
  }
  // The budget is the client's; the device's room is admitted as for a
  // calibrated run.
  if (options_.refuse_unfit_steps) {
    if (absl::Status fits = StepFits(choice->chosen.plan); !fits.ok()) {
      fail(absl::Status(
          fits.code(),
          absl::StrCat("the training was refused before it allocated "
                       "anything: under memory_budget_bytes ",
                       budget_bytes, " the chosen configuration (",
                       choice->chosen.Describe(base), ") ", fits.message())));
      return;
    }
  }
  plan->budget_choice = choice->chosen.Describe(base);
  plan->planned_peak_bytes.store(choice->chosen.plan.peak_allocated_bytes);
  op->SetProgress(
      0, train->steps, "steps",
      absl::StrFormat("under %d bytes: %s, planned peak %d bytes", budget_bytes,
                      plan->budget_choice, choice->chosen.plan.peak_allocated_bytes));
  if (absl::Status posted = start(*chosen, choice->spec.offload); !posted.ok()) {
    fail(posted);
  }
}

}  // namespace memprofd
