// Session: training operations, with the offloader and the memory recorder
// wired into every step.

#include <ATen/ATen.h>

#include <exception>
#include <functional>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/log.h"
#include "core/common/option_status.h"
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
#include "core/session/session.h"
#include "core/session/snapshot_scheduler.h"
#include "core/session/training_data.h"
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
  // Starts the run on the owner thread with the options given: at once, or
  // (under a budget) from the plan thread with the options it chose.
  auto plan = std::make_shared<TrainingPlan>();
  auto start_with = [this, vocab_size, resumed_tokens, in_request, resume = spec.resume,
                     offload_request = spec.offload, plan](
                        const std::shared_ptr<Operation>& op,
                        const std::shared_ptr<TrainingSlot::Ticket>& ticket) -> StartRun {
    return [this, op, ticket, vocab_size, resumed_tokens, in_request, resume,
            offload_request, plan](const ValidTrainOptions& valid,
                                   const offload::OffloadOptions& offload_options) {
      // Data parallel: the followers get the merged options and the
      // request's own offload fields (each merges them over its own flags),
      // with whether to offload, and where, as a budget chose it; published
      // by the owner thread when it starts the run, in the order it runs
      // things.
      offload::OffloadOverrides followers_offload = offload_request;
      if (!plan->budget_choice.empty()) {
        followers_offload.enabled = offload_options.enabled;
        followers_offload.target = offload_options.target;
      }
      return owner_->Post([this, op, ticket, valid, offload_options, vocab_size,
                           resumed_tokens, in_request, resume, plan,
                           command =
                               ranks_->TrainCommand(valid, followers_offload, resume)] {
        // The run never started.
        auto fail = [&](const absl::Status& status) { ticket->Finish(op, status); };
        absl::StatusOr<TrainingData> read =
            in_request ? absl::StatusOr<TrainingData>(*in_request)
                       : ReadTrainingData(valid, vocab_size, resumed_tokens,
                                          ClientDataAccess(data_roots_, options_, op));
        if (!read.ok()) {
          fail(read.status());
          return;
        }
        if (!command.empty()) {
          if (absl::Status s = ranks_->PublishCommand(command); !s.ok()) {
            fail(s);
            ranks_->FailRun(s);
            return;
          }
        }
        RunTraining(op, ticket, valid, offload_options, *read->data,
                    read->eval_data.get(), resume, plan);
      });
    };
  };
  std::shared_ptr<Operation> op;
  {
    absl::MutexLock lock(&mu_);
    // Draining comes first: the training that still runs is being stopped,
    // so "another is running" would send the caller to wait for nothing.
    if (draining()) {
      return absl::UnavailableError(
          "memprofd is shutting down; retry against another instance, or once it is "
          "back");
    }
    // The training's place, held from here, through a budget's planning, to
    // the run's end (or given back at once if the operation is refused).
    ASSIGN_OR_RETURN(std::shared_ptr<TrainingSlot::Ticket> ticket, training_slot_.Take());
    ASSIGN_OR_RETURN(op, operations_.Admit(OperationKind::kTrain));
    const StartRun start = start_with(op, ticket);
    // The plan thread admits the run: it chooses the configuration under a
    // budget, or plans (calibrates) the one given, just before the run
    // starts, behind a PlanMemory if one is queued (StartTraining's
    // contract). In a data-parallel run rank 0 admits it for every rank:
    // refused, the command never reaches the followers.
    absl::Status posted =
        spec.memory_budget_bytes
            ? plans_->Post([this, op, ticket, config = model->config, valid,
                            offload_options, budget = *spec.memory_budget_bytes, plan,
                            start] {
                PlanUnderBudget(op, ticket, config, valid, offload_options, budget, plan,
                                start);
              })
            : plans_->Post([this, op, ticket, config = model->config, valid,
                            offload_options, plan, start] {
                CalibrateRun(op, ticket, config, valid, offload_options, plan, start);
              });
    // Shutdown began since the check above.
    if (!posted.ok()) {
      ticket->Finish(op, posted);
      return posted;
    }
  }
  return op;
}

// One training operation's part in each step (step_listener.h): the
// reports, counters and observers after each step, the boundary work between
// steps (and, data parallel, the ranks' agreement on stopping there), and the
// OOM report of a step that ran out of memory.
class Session::TrainingRun : public StepListener {
 public:
  TrainingRun(Session* session, std::shared_ptr<Operation> op, int64_t steps,
              const offload::OffloadStepListener* offload, DataParallel* data_parallel,
              std::shared_ptr<const TrainingPlan> plan)
      : session_(session),
        op_(std::move(op)),
        steps_(steps),
        plan_(std::move(plan)),
        offload_(offload),
        data_parallel_(data_parallel),
        observers_(session->Observers()) {}

  // The first failure of the data-parallel run's own collectives outside a
  // step (drift checks); the run ends with it at the next boundary.
  const absl::Status& failure() const { return failure_; }

  absl::StatusOr<bool> AtBoundary() override {
    if (data_parallel_ == nullptr) {
      session_->snapshots_->RunBoundaryWork();
      return false;  // the cancel is the run's cheap predicate
    }
    RETURN_IF_ERROR(failure_);
    // Fully sharded: snapshots at this boundary stream the parameters, and
    // evaluations gather the whole model, every rank taking part.
    return session_->ranks_->SyncStepBoundary(op_->cancel_requested(),
                                              data_parallel_->parameter_sharding());
  }

  void OnStepFailed(const absl::Status& status, int64_t global_step) override {
    if (!absl::IsResourceExhausted(status)) return;
    // Memory may still be short: a report that cannot be built must not take
    // the owner thread down with it.
    try {
      Session& s = *session_;
      s.oom_->RecordOutOfMemory(
          status, global_step,
          {s.host_->model(), s.host_->trainer(), s.host_->offloader(),
           s.snapshots_->async_staging_bytes()});
    } catch (const std::exception& e) {
      LogWarning(
          absl::StrCat("step ", global_step,
                       " ran out of memory; no OOM report could be built: ", e.what()));
    }
  }

  void OnStepReported(const StepReport& report) override;

 private:
  Session* const session_;
  const std::shared_ptr<Operation> op_;
  const int64_t steps_;
  const std::shared_ptr<const TrainingPlan> plan_;  // never null
  const offload::OffloadStepListener* const offload_;
  DataParallel* const data_parallel_;  // null: a single process
  const std::vector<std::shared_ptr<SessionObserver>> observers_;
  absl::Status failure_;
};

void Session::TrainingRun::OnStepReported(const StepReport& report) {
  Session& s = *session_;
  SessionStepReport r;
  r.step = report;
  r.offload = offload_->last_step();
  r.peak_allocated_bytes = StepPeakBytes(s.runtime_.recorder(), s.device_);
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
  {
    absl::MutexLock lock(&s.mu_);
    s.counters_.steps_total += 1;
    s.counters_.tokens_total += report.tokens;
    s.counters_.last_loss = report.loss;
    s.counters_.has_loss = true;
    s.counters_.offload_totals.Add(r.offload);
    s.counters_.last_step = r;
    if (r.planned_peak_bytes > 0) {
      s.counters_.plan_error_ratio =
          static_cast<double>(r.peak_allocated_bytes - r.planned_peak_bytes) /
          static_cast<double>(r.planned_peak_bytes);
    }
    if (data_parallel_ != nullptr) {
      DataParallelCounters& dp = s.counters_.data_parallel;
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
  }
  if (report.eval) s.CountEvaluation(*report.eval);
  s.host_->PublishStep(report.global_step);
  s.oom_->RecordStepPeaks(r, s.Counters().categories);
  s.snapshots_->MaybeQueuePeriodicSnapshot(report.global_step);
}

void Session::RunTraining(const std::shared_ptr<Operation>& op,
                          std::shared_ptr<TrainingSlot::Ticket> ticket,
                          const ValidTrainOptions& train,
                          const offload::OffloadOptions& offload_options,
                          const TokenDataset& data, const TokenDataset* eval_data,
                          bool resume, std::shared_ptr<const TrainingPlan> plan) {
  auto finish = [&](absl::Status status, OperationResult result = {}) {
    ticket->Finish(op, std::move(status), std::move(result));
  };
  // Data parallel: every rank runs what rank 0 runs, so a cancel before the
  // start is left to the first step boundary, which all ranks see alike.
  if (ranks_->group() == nullptr && op->cancel_requested()) {
    finish(absl::CancelledError("cancelled before it started"), TrainResult{});
    return;
  }
  op->MarkRunning();
  absl::StatusOr<offload::Offloader*> offloader = host_->OffloaderFor(offload_options);
  if (!offloader.ok()) {
    finish(offloader.status());
    return;
  }
  LlamaModel* const model = host_->model();
  Trainer* const trainer = host_->trainer();
  // The model is on its device by now, so the CUDA allocator is set up and
  // takes the observer; an allocation failure before this run is stale.
  if (!c10::Device(device_).is_cpu()) memory::InstallCudaOomObserver();
  memory::TakeOomCapture();

  // Data parallel: every rank takes rank 0's weights and optimizer state and
  // averages gradients in buckets during backward (DataParallel).
  std::unique_ptr<DataParallel> data_parallel;
  if (ranks_->group() != nullptr) {
    DataParallelOptions dp_options;
    dp_options.sharding = options_.sharding;
    absl::StatusOr<std::unique_ptr<DataParallel>> created =
        DataParallel::Create(ranks_->group(), trainer, dp_options);
    if (!created.ok()) {
      finish(created.status());
      ranks_->FailRun(created.status());
      return;
    }
    data_parallel = *std::move(created);
    absl::MutexLock lock(&mu_);
    counters_.data_parallel.active = true;
  }

  // The step's listeners, in calling order: the offloader, the gradient
  // synchronisation (whose OnStepEnd puts the global loss in the report),
  // then this operation's reporting.
  offload::OffloadStepListener offload(*offloader, model);
  TrainingRun run(this, op, train->steps, &offload, data_parallel.get(), plan);
  StepListeners listeners = {&offload};
  if (data_parallel != nullptr) listeners.push_back(data_parallel.get());
  listeners.push_back(&run);
  // A cancel (or shutdown) stops a single-process run at a boundary or
  // within a step; data-parallel ranks stop together at a boundary (through
  // TrainingRun::AtBoundary), so they poll nothing.
  std::function<bool()> cancelled;
  if (data_parallel == nullptr) cancelled = [op] { return op->cancel_requested(); };
  // The op half of attribution for the training's lifetime (every thread's
  // ops, autograd's included; the module scopes come from the forward).
  memory::OpAttribution op_attribution;
  const int64_t nonfinite_before = trainer->nonfinite_steps();
  TrainRunRequest request;
  request.cancelled = std::move(cancelled);
  request.listeners = std::move(listeners);
  request.data = &data;
  request.eval_data = eval_data;
  request.continue_last = resume;
  absl::StatusOr<TrainResult> result = trainer->Run(train, request);
  // Fully sharded: the model whole again on every rank, as outside a run,
  // when the ranks are still in step: the run succeeded or was cancelled,
  // or its options were refused alike on every rank before any collective.
  // Otherwise the run is broken and the daemon stops (below).
  absl::Status whole = data_parallel != nullptr && run.failure().ok() &&
                               (result.ok() || absl::IsInvalidArgument(result.status()))
                           ? data_parallel->Finish()
                           : absl::OkStatus();
  data_parallel.reset();  // removes the gradient hooks
  if (const int64_t n = trainer->nonfinite_steps() - nonfinite_before; n > 0) {
    absl::MutexLock lock(&mu_);
    counters_.nonfinite_steps_total += n;
  }
  host_->PublishCategories();
  host_->PublishRun();
  if (ranks_->group() != nullptr) {
    // A step that failed on one rank leaves the others in a collective that
    // will not complete: the run cannot go on. (Bad options fail alike on
    // every rank before any collective, and do not break it.)
    absl::Status failure = !run.failure().ok() ? run.failure()
                           : !whole.ok()       ? whole
                                               : result.status();
    if (!failure.ok() && !absl::IsInvalidArgument(failure)) {
      finish(failure);
      ranks_->FailRun(failure);
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
    if (ranks_->group() == nullptr) snapshots_->RunBoundaryWork();
    absl::Status drained =
        DrainedRunStatus(options_.snapshot_root, train->steps, *result);
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
