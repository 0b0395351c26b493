#include "core/session/training.h"

#include <ATen/ATen.h>

#include <exception>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/log.h"
#include "core/common/status_macros.h"
#include "core/dist/data_parallel.h"
#include "core/memory/oom_report.h"
#include "core/memory/op_attribution.h"
#include "core/memory/recorder.h"
#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/offload/step_listener.h"
#include "core/session/model_host.h"
#include "core/session/oom_reporter.h"
#include "core/session/owner_thread.h"
#include "core/session/rank_coordinator.h"
#include "core/session/runtime.h"
#include "core/session/session_counters.h"
#include "core/session/snapshot_scheduler.h"
#include "core/snapshot/snapshot_store.h"
#include "core/train/data.h"
#include "core/train/step_listener.h"
#include "core/train/trainer.h"

namespace memprofd {
namespace {

int64_t StepPeakBytes(const memory::MemoryRecorder& recorder, const std::string& device) {
  memory::MemoryStatsView stats = recorder.Stats();
  for (const auto& p : stats.last_step_peaks) {
    if (p.device == device) return p.peak_bytes;
  }
  return 0;
}

// A training the drain stopped (Operation::RequestDrain): ABORTED, naming
// the checkpoint a daemon restarted with --resume=latest goes on from,
// which it records in `result`.
absl::Status DrainedRunStatus(const std::string& snapshot_root, int64_t steps,
                              TrainResult& result) {
  std::optional<snapshot::SnapshotManifest> latest;
  if (!snapshot_root.empty()) {
    absl::StatusOr<std::optional<snapshot::SnapshotManifest>> found =
        snapshot::LatestCheckpoint(snapshot_root);
    if (found.ok()) latest = *std::move(found);
  }
  std::string resume;
  const int64_t repeated = latest ? result.global_step - latest->global_step : 0;
  if (latest) {
    result.resume_checkpoint = latest->name;
    result.resume_global_step = latest->global_step;
    resume = absl::StrCat(
        "checkpoint '", latest->name, "' holds global step ", latest->global_step,
        repeated == 1  ? " (the step after it runs again)"
        : repeated > 1 ? absl::StrCat(" (the ", repeated, " steps after it run again)")
                       : "",
        ": start memprofd with --resume=latest and Train with resume to go on");
  } else {
    resume =
        "no checkpoint holds it (--snapshot_on_shutdown or --snapshot_every_steps, with "
        "--snapshot_root, keep one)";
  }
  return absl::AbortedError(absl::StrCat(
      "memprofd is shutting down: the training stopped after ", result.steps_completed,
      " of ", steps, " steps, at global step ", result.global_step, "; ", resume));
}

}  // namespace

Training::Training(Parts parts) : parts_(parts) {}

Training::~Training() = default;

absl::Status Training::Admit(Admitted admitted) {
  auto shared = std::make_shared<const Admitted>(std::move(admitted));
  auto plan = std::make_shared<Plan>();
  // The plan thread admits the run: it chooses the configuration under a
  // budget, or plans (calibrates) the one given, just before the run starts,
  // behind a PlanMemory if one is queued. In a data-parallel run rank 0
  // admits it for every rank: refused, the command never reaches the
  // followers.
  absl::Status posted = parts_.plans.Post([this, shared, plan] {
    if (shared->budget_bytes) {
      PlanUnderBudget(shared, plan);
    } else {
      Calibrate(shared, plan);
    }
  });
  if (!posted.ok()) shared->ticket->Finish(shared->op, posted);
  return posted;
}

absl::Status Training::Follow(std::shared_ptr<Operation> op,
                              std::shared_ptr<TrainingSlot::Ticket> ticket,
                              const ValidTrainOptions& train,
                              const offload::OffloadOptions& offload, TrainingData data,
                              bool resume) {
  absl::Status posted =
      parts_.owner.Post([this, op, ticket, train, offload, data, resume] {
        Run(op, ticket, train, offload, data, resume, std::make_shared<Plan>());
      });
  if (!posted.ok()) ticket->Finish(op, posted);
  return posted;
}

absl::Status Training::MakeModelWhole() {
  if (sharded_model_ == nullptr) return absl::OkStatus();
  absl::Status whole = TakeShardedModel()->Finish();  // removes the gradient hooks after
  parts_.counters.Update(
      [](SessionCounters& c) { c.data_parallel.whole_model_gathers_total += 1; });
  parts_.host.PublishCategories();
  return whole;
}

void Training::DropShardedModel() { TakeShardedModel().reset(); }

void Training::KeepShardedModel(std::unique_ptr<DataParallel> data_parallel) {
  sharded_model_ = std::move(data_parallel);
  parts_.ranks.KeepShardedModel(sharded_model_->parameter_sharding());
  parts_.counters.Update(
      [](SessionCounters& c) { c.data_parallel.model_sharded = true; });
}

std::unique_ptr<DataParallel> Training::TakeShardedModel() {
  parts_.ranks.KeepShardedModel(nullptr);
  parts_.counters.Update(
      [](SessionCounters& c) { c.data_parallel.model_sharded = false; });
  return std::move(sharded_model_);
}

// Stage 2: the start.

absl::Status Training::Start(const std::shared_ptr<const Admitted>& admitted,
                             const ValidTrainOptions& train,
                             const offload::OffloadOptions& offload,
                             const std::shared_ptr<Plan>& plan) {
  // Data parallel: the followers get the merged options and the request's
  // own offload fields (each merges them over its own flags), with whether
  // to offload, and where, as a budget chose it; published by the owner
  // thread when it starts the run, in the order it runs things.
  offload::OffloadOverrides followers_offload = admitted->offload_request;
  if (!plan->budget_choice.empty()) {
    followers_offload.enabled = offload.enabled;
    followers_offload.target = offload.target;
  }
  std::string command =
      parts_.ranks.TrainCommand(train, followers_offload, admitted->resume);
  return parts_.owner.Post([this, admitted, train, offload, plan,
                            command = std::move(command)] {
    const Admitted& a = *admitted;
    // The run never started.
    auto fail = [&](const absl::Status& status) { a.ticket->Finish(a.op, status); };
    absl::StatusOr<TrainingData> read =
        a.in_request
            ? absl::StatusOr<TrainingData>(*a.in_request)
            : ReadTrainingData(train, a.config.vocab_size, a.resumed_tokens,
                               ClientDataAccess(parts_.data_roots, parts_.options, a.op));
    if (!read.ok()) {
      fail(read.status());
      return;
    }
    if (!command.empty()) {
      if (absl::Status s = parts_.ranks.PublishCommand(command); !s.ok()) {
        fail(s);
        parts_.ranks.FailRun(s);
        return;
      }
    }
    Run(a.op, a.ticket, train, offload, *read, a.resume, plan);
  });
}

// Stage 3: the run.

// One training operation's part in each step (step_listener.h): the
// reports, counters and observers after each step, the boundary work between
// steps (and, data parallel, the ranks' agreement on stopping there), and the
// OOM report of a step that ran out of memory.
class Training::StepReporter : public StepListener {
 public:
  StepReporter(const Parts& parts, std::shared_ptr<Operation> op, int64_t steps,
               const offload::OffloadStepListener* offload, DataParallel* data_parallel,
               std::shared_ptr<const Plan> plan)
      : parts_(parts),
        op_(std::move(op)),
        steps_(steps),
        plan_(std::move(plan)),
        offload_(offload),
        data_parallel_(data_parallel),
        observers_(parts.observers.Get()) {}

  // The first failure of the data-parallel run's own collectives outside a
  // step (drift checks); the run ends with it at the next boundary.
  const absl::Status& failure() const { return failure_; }

  absl::StatusOr<bool> AtBoundary() override {
    if (data_parallel_ == nullptr) {
      parts_.snapshots.RunBoundaryWork();
      return false;  // the cancel is the run's cheap predicate
    }
    RETURN_IF_ERROR(failure_);
    // Fully sharded: snapshots at this boundary stream the parameters, and
    // evaluations the model's units, every rank taking part.
    return parts_.ranks.SyncStepBoundary(op_->cancel_requested(),
                                         data_parallel_->parameter_sharding());
  }

  void OnStepFailed(const absl::Status& status, int64_t global_step) override {
    if (!absl::IsResourceExhausted(status)) return;
    // Memory may still be short: a report that cannot be built must not take
    // the owner thread down with it.
    try {
      ModelHost& host = parts_.host;
      parts_.oom.RecordOutOfMemory(status, global_step,
                                   {host.model(), host.trainer(), host.offloader(),
                                    parts_.snapshots.async_staging_bytes()});
    } catch (const std::exception& e) {
      LogWarning(
          absl::StrCat("step ", global_step,
                       " ran out of memory; no OOM report could be built: ", e.what()));
    }
  }

  void OnStepReported(const StepReport& report) override;

 private:
  // The data-parallel counters after a step (and its drift check, if one
  // ran).
  void CountDataParallel(DataParallelCounters& dp, std::optional<double> drift) const;

  const Parts& parts_;
  const std::shared_ptr<Operation> op_;
  const int64_t steps_;
  const std::shared_ptr<const Plan> plan_;  // never null
  const offload::OffloadStepListener* const offload_;
  DataParallel* const data_parallel_;  // null: a single process
  const std::vector<std::shared_ptr<SessionObserver>> observers_;
  absl::Status failure_;
};

void Training::StepReporter::OnStepReported(const StepReport& report) {
  SessionStepReport r;
  r.step = report;
  r.offload = offload_->last_step();
  r.peak_allocated_bytes = StepPeakBytes(parts_.runtime.recorder(), parts_.device);
  r.planned_peak_bytes = plan_->planned_peak_bytes.load();
  if (report.step == 1) r.budget_choice = plan_->budget_choice;
  op_->AppendEvent(r);
  for (const auto& observer : observers_) observer->OnStep(r);
  std::optional<double> drift;
  if (data_parallel_ != nullptr && data_parallel_->replicated() && failure_.ok() &&
      (report.global_step % RankCoordinator::kDriftEverySteps == 0 ||
       report.step == steps_)) {
    absl::StatusOr<double> d = data_parallel_->Drift();
    if (d.ok()) {
      drift = *d;
    } else {
      failure_ = d.status();
    }
  }
  op_->SetProgress(report.step, steps_, "steps",
                   absl::StrFormat("step %d/%d, loss %.4f, %.0f tokens/s", report.step,
                                   steps_, report.loss, report.tokens_per_second));
  parts_.counters.Update([&](SessionCounters& c) {
    c.steps_total += 1;
    c.tokens_total += report.tokens;
    c.last_loss = report.loss;
    c.has_loss = true;
    c.offload_totals.Add(r.offload);
    c.last_step = r;
    if (r.planned_peak_bytes > 0) {
      c.plan_error_ratio =
          static_cast<double>(r.peak_allocated_bytes - r.planned_peak_bytes) /
          static_cast<double>(r.planned_peak_bytes);
    }
    if (data_parallel_ != nullptr) CountDataParallel(c.data_parallel, drift);
  });
  if (report.eval) parts_.counters.CountEvaluation(*report.eval);
  parts_.host.PublishStep(report.global_step);
  parts_.oom.RecordStepPeaks(r, parts_.host.Categories());
  parts_.snapshots.MaybeQueuePeriodicSnapshot(report.global_step);
}

void Training::StepReporter::CountDataParallel(DataParallelCounters& dp,
                                               std::optional<double> drift) const {
  const GradientSyncStats& sync = data_parallel_->last_step();
  dp.allreduce_bytes = sync.bytes;
  dp.buckets = sync.buckets;
  dp.buckets_overlapped = sync.buckets_started_in_backward;
  dp.allreduce_exposed_seconds = sync.exposed_seconds;
  dp.allreduce_exposed_seconds_total += sync.exposed_seconds;
  if (const ParameterShardingStats* p = data_parallel_->parameter_stats()) {
    dp.owned_parameter_bytes = p->owned_bytes;
    dp.peak_gathered_parameter_bytes = p->peak_gathered_bytes;
    dp.parameter_gathers = p->gathers;
    dp.gather_exposed_seconds = p->exposed_seconds;
    dp.gather_exposed_seconds_total += p->exposed_seconds;
  }
  if (drift) {
    dp.parameter_drift = drift;
    dp.drift_checks_total += 1;
  }
}

void Training::Run(const std::shared_ptr<Operation>& op,
                   const std::shared_ptr<TrainingSlot::Ticket>& ticket,
                   const ValidTrainOptions& train,
                   const offload::OffloadOptions& offload_options,
                   const TrainingData& data, bool resume,
                   std::shared_ptr<const Plan> plan) {
  RankCoordinator& ranks = parts_.ranks;
  auto finish = [&](absl::Status status, OperationResult result = {}) {
    ticket->Finish(op, std::move(status), std::move(result));
  };
  // Data parallel: every rank runs what rank 0 runs, so a cancel before the
  // start is left to the first step boundary, which all ranks see alike.
  if (ranks.group() == nullptr && op->cancel_requested()) {
    finish(absl::CancelledError("cancelled before it started"), TrainResult{});
    return;
  }
  op->MarkRunning();
  ModelHost& host = parts_.host;
  LlamaModel* const model = host.model();
  Trainer* const trainer = host.trainer();
  // LoRA adapters are the trainable parameters: sharding their optimizer
  // state and gradients is as for any model. Full sharding would also have
  // to shard the frozen base, which it does not yet: refused before the
  // model changes.
  if (ranks.group() != nullptr && parts_.options.sharding == Sharding::kFull &&
      (train->lora.r != 0 || model->lora())) {
    finish(absl::UnimplementedError(
        "LoRA adapters with --sharding=full are not supported yet (the frozen base "
        "would have to be sharded too): run the ranks with --sharding=gradients, "
        "optimizer or none"));
    return;
  }
  // The last fully sharded run's model: this run goes on from its shards,
  // their optimizer state and the same data parallel state. (Nothing below
  // changes a fully sharded model: adapters are refused above, and a bf16
  // base without them is refused before the model changes.)
  const bool from_shards = sharded_model_ != nullptr;
  absl::StatusOr<offload::Offloader*> offloader = host.OffloaderFor(offload_options);
  if (!offloader.ok()) {
    finish(offloader.status());
    return;
  }
  // The model is on its device by now, so the CUDA allocator is set up and
  // takes the observer; an allocation failure before this run is stale.
  if (!c10::Device(parts_.device).is_cpu()) memory::InstallCudaOomObserver();
  memory::TakeOomCapture();

  // The run's LoRA adapters, before data parallel takes the parameters. The
  // options are the same on every rank, so a refusal is too.
  const bool had_adapters = model->lora().has_value();
  const at::ScalarType had_base = model->base_dtype();
  const absl::Status added = trainer->AddAdapters(train);
  // DescribeModel lists the new adapters with the parameters, and a base
  // cast to bf16 (even part way) with its dtype.
  if (had_adapters != model->lora().has_value() || had_base != model->base_dtype()) {
    host.PublishModel();
  }
  if (!added.ok()) {
    finish(added);
    return;
  }

  // Data parallel: every rank takes rank 0's weights and optimizer state and
  // averages gradients in buckets during backward (DataParallel).
  std::unique_ptr<DataParallel> data_parallel;
  if (from_shards) {
    data_parallel = TakeShardedModel();
  } else if (ranks.group() != nullptr) {
    DataParallelOptions dp_options;
    dp_options.sharding = parts_.options.sharding;
    absl::StatusOr<std::unique_ptr<DataParallel>> created =
        DataParallel::Create(ranks.group(), trainer, dp_options);
    if (!created.ok()) {
      finish(created.status());
      ranks.FailRun(created.status());
      return;
    }
    data_parallel = *std::move(created);
    parts_.counters.Update([](SessionCounters& c) { c.data_parallel.active = true; });
  }

  // The step's listeners, in calling order: the offloader, the gradient
  // synchronisation (whose OnStepEnd puts the global loss in the report),
  // then this operation's reporting.
  offload::OffloadStepListener offload(*offloader, model);
  StepReporter reporter(parts_, op, train->steps, &offload, data_parallel.get(), plan);
  TrainRunRequest request;
  request.listeners = {&offload};
  if (data_parallel != nullptr) request.listeners.push_back(data_parallel.get());
  request.listeners.push_back(&reporter);
  // A cancel (or shutdown) stops a single-process run at a boundary or
  // within a step; data-parallel ranks stop together at a boundary (through
  // StepReporter::AtBoundary), so they poll nothing.
  if (data_parallel == nullptr)
    request.cancelled = [op] { return op->cancel_requested(); };
  request.data = data.data.get();
  request.eval_data = data.eval_data.get();
  request.continue_last = resume;
  // The op half of attribution for the training's lifetime (every thread's
  // ops, autograd's included; the module scopes come from the forward).
  memory::OpAttribution op_attribution;
  const int64_t nonfinite_before = trainer->nonfinite_steps();
  absl::StatusOr<TrainResult> result = trainer->Run(train, request);
  // Fully sharded, when the ranks are still in step (the run succeeded or
  // was cancelled, or its options were refused alike on every rank before
  // any collective): the model stays sharded, kept until MakeModelWhole.
  // Otherwise the run is broken and the daemon stops (below). At the other
  // levels every rank holds the whole model all along.
  const bool in_step = reporter.failure().ok() &&
                       (result.ok() || absl::IsInvalidArgument(result.status()));
  if (data_parallel != nullptr && in_step && !data_parallel->replicated()) {
    KeepShardedModel(std::move(data_parallel));
  }
  data_parallel.reset();  // removes the gradient hooks
  if (const int64_t n = trainer->nonfinite_steps() - nonfinite_before; n > 0) {
    parts_.counters.Update([n](SessionCounters& c) { c.nonfinite_steps_total += n; });
  }
  host.PublishCategories();
  host.PublishRun();
  if (ranks.group() != nullptr) {
    // A step that failed on one rank leaves the others in a collective that
    // will not complete: the run cannot go on. (Bad options fail alike on
    // every rank before any collective, and do not break it.)
    absl::Status failure =
        !reporter.failure().ok() ? reporter.failure() : result.status();
    if (!failure.ok() && !absl::IsInvalidArgument(failure)) {
      finish(failure);
      ranks.FailRun(failure);
      return;
    }
  }
  if (result.ok()) {
    result->budget_choice = plan->budget_choice;
    result->planned_peak_bytes = plan->planned_peak_bytes.load();
  }
  if (!result.ok()) {
    finish(result.status());
  } else if (result->cancelled && op->drain_requested()) {
    // A single process runs the shutdown snapshot here, at the boundary it
    // stopped at, if the stop came within a step; a data-parallel run ran
    // it at its last boundary, all ranks together.
    if (ranks.group() == nullptr) parts_.snapshots.RunBoundaryWork();
    absl::Status drained =
        DrainedRunStatus(parts_.options.snapshot_root, train->steps, *result);
    finish(std::move(drained), *result);
  } else if (result->cancelled) {
    finish(absl::CancelledError(absl::StrCat("cancelled after ", result->steps_completed,
                                             " of ", train->steps, " steps")),
           *result);
  } else {
    finish(absl::OkStatus(), *result);
  }
}

}  // namespace memprofd
