// Stage 1 of a training (training.h): its admission on the plan thread.
// The step is planned as this session's device runs it, and refused when the
// device cannot hold it; under a memory budget, the fastest configuration
// whose plan fits is chosen instead.

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/log.h"
#include "core/memory/oom_report.h"
#include "core/memory/recorder.h"
#include "core/plan/budget.h"
#include "core/plan/planner.h"
#include "core/session/model_host.h"
#include "core/session/owner_thread.h"
#include "core/session/plan_support.h"
#include "core/session/runtime.h"
#include "core/session/training.h"

namespace memprofd {
namespace {

// The plan of a training step of `config` as this session's device runs it,
// on each rank of its data-parallel run (one process: world 1).
plan::PlanSpec TrainingPlanSpec(const std::string& device, const SessionOptions& options,
                                const LlamaConfig& config, BaseDtype base_dtype,
                                const ValidTrainOptions& train,
                                const offload::OffloadOptions& offload) {
  plan::PlanSpec spec;
  spec.model = config;
  spec.model_base_dtype = base_dtype;
  spec.train = train.get();
  spec.offload = offload;
  spec.target = TargetOf(device);
  spec.world_size = options.world.world_size;
  spec.sharding = options.sharding;
  spec.data_bytes = PlannedDataBytes(spec.train);
  return spec;
}

}  // namespace

int64_t Training::OwnPlannedPeak(const plan::MemoryPlan& planned) const {
  for (const plan::RankPlan& rank : planned.ranks) {
    if (rank.rank == parts_.options.world.rank) return rank.peak_allocated_bytes;
  }
  return planned.peak_allocated_bytes;
}

absl::Status Training::StepFits(const plan::MemoryPlan& planned) const {
  const int64_t peak = OwnPlannedPeak(planned);
  const int device = parts_.host.recorder_device();
  const memory::DeviceRoom room = memory::QueryDeviceRoom(device);
  if (room.free_bytes < 0) return absl::OkStatus();  // nothing known to compare with
  // What the device holds for this process now (the model, any optimizer
  // state) is inside the plan's peak and no longer free.
  int64_t held = 0;
  for (const memory::DeviceMemoryStats& d : parts_.runtime.recorder().Stats().devices) {
    if (d.index == device) held = d.current_bytes;
  }
  const int64_t more = peak - held;
  if (more <= room.free_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "its step is planned to peak at %d bytes%s, %d more than this process holds now, "
      "and the %s device has %d bytes free; lower batch_size or seq_len, set "
      "gradient_checkpointing or offloading, or give memory_budget_bytes",
      peak,
      planned.world_size > 1 ? absl::StrCat(" on rank ", parts_.options.world.rank)
                             : std::string(),
      more, parts_.device, room.free_bytes));
}

void Training::Calibrate(const std::shared_ptr<const Admitted>& admitted,
                         const std::shared_ptr<Plan>& plan) {
  const Admitted& a = *admitted;
  const std::shared_ptr<Operation>& op = a.op;
  if (!op->done() && !op->cancel_requested() && !parts_.plans.stopping()) {
    plan::PlanSpec spec = TrainingPlanSpec(parts_.device, parts_.options, a.config,
                                           a.base_dtype, a.train, a.offload);
    // A training cancelled meanwhile stops its plan between layers, so that
    // the next training's calibration, queued behind it, runs at once; so
    // does the cap on a plan.
    const PlanClock clock(op, parts_.options.max_plan_time);
    spec.cancelled = clock.StopWhen();
    // Admission: a step beyond the plan's size admission, or whose planned
    // peak cannot fit what the device has free, is refused before the run
    // allocates anything. A plan that fails otherwise leaves the run
    // unplanned (logged below), never refused.
    absl::Status admission = plan::CheckPlanSize(spec);
    absl::StatusOr<plan::MemoryPlan> planned =
        admission.ok()
            ? PlanGuarded<plan::MemoryPlan>("calibration plan",
                                            [&] { return plan::PlanTrainingStep(spec); })
            : absl::StatusOr<plan::MemoryPlan>(admission);
    if (planned.ok()) admission = StepFits(*planned);
    // A plan the cap stopped decided nothing: the run is not admitted.
    const absl::Status explained =
        clock.Explain(planned.status(), "the plan that admits the training");
    if (absl::IsDeadlineExceeded(explained)) admission = explained;
    if (parts_.options.refuse_unfit_steps && !admission.ok()) {
      a.ticket->Finish(op,
                       absl::Status(admission.code(),
                                    absl::StrCat("the training was refused before it "
                                                 "allocated anything: ",
                                                 admission.message())),
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
  if (absl::Status posted = Start(admitted, a.train, a.offload, plan); !posted.ok()) {
    a.ticket->Finish(op, std::move(posted), TrainResult{});
  }
}

void Training::PlanUnderBudget(const std::shared_ptr<const Admitted>& admitted,
                               const std::shared_ptr<Plan>& plan) {
  const Admitted& a = *admitted;
  const std::shared_ptr<Operation>& op = a.op;
  const int64_t budget_bytes = *a.budget_bytes;
  auto fail = [&](absl::Status status) {
    a.ticket->Finish(op, std::move(status), TrainResult{});
  };
  if (op->cancel_requested()) {
    fail(absl::CancelledError("cancelled before it started"));
    return;
  }
  op->SetProgress(
      0, a.train->steps, "steps",
      absl::StrFormat("choosing a configuration under %d bytes", budget_bytes));
  plan::PlanSpec base = TrainingPlanSpec(parts_.device, parts_.options, a.config,
                                         a.base_dtype, a.train, a.offload);
  const PlanClock clock(op, parts_.options.max_plan_time);
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
      ValidTrainOptions::Check(choice->spec.train, a.config.max_position_embeddings);
  if (!chosen.ok()) {
    fail(chosen.status());
    return;
  }
  // The budget is the client's; the device's room is admitted as for a
  // calibrated run.
  if (parts_.options.refuse_unfit_steps) {
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
      0, a.train->steps, "steps",
      absl::StrFormat("under %d bytes: %s, planned peak %d bytes", budget_bytes,
                      plan->budget_choice, choice->chosen.plan.peak_allocated_bytes));
  if (absl::Status posted = Start(admitted, *chosen, choice->spec.offload, plan);
      !posted.ok()) {
    fail(posted);
  }
}

}  // namespace memprofd
