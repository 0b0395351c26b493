// Session: training operations, with the offloader and the memory recorder
// wired into every step.

#include <ATen/ATen.h>

#include <exception>
#include <utility>

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
#include "core/session/session.h"
#include "core/session/training_data.h"
#include "core/train/data.h"
#include "core/train/trainer.h"

namespace memprofd {
namespace {

int64_t StepPeakBytes(const std::string& device) {
  memory::MemoryStatsView stats = memory::MemoryRecorder::Global().Stats();
  for (const auto& p : stats.last_step_peaks) {
    if (p.device == device) return p.peak_bytes;
  }
  return 0;
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
  RETURN_IF_ERROR(CheckLeader("Train"));
  std::optional<ModelSummary> model = Model();
  if (!model) {
    return absl::FailedPreconditionError("no model is loaded; LoadModel first");
  }
  TrainOptions defaults;
  TrainRequest request = spec.train;
  std::optional<RunState> run;
  if (spec.resume) {
    {
      absl::MutexLock lock(&mu_);
      run = run_;
    }
    if (!run) {
      return absl::FailedPreconditionError(
          "there is no training run to resume on this model: load a checkpoint with "
          "resume (LoadModel resume, memprofd --resume) or train without resume");
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
  ASSIGN_OR_RETURN(
      const TrainOptions train,
      MergeTrainRequest(defaults, request, model->config.max_position_embeddings));
  ASSIGN_OR_RETURN(const offload::OffloadOptions offload_options,
                   offload::MergeOffloadRequest(options_.offload, spec.offload));
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
  std::shared_ptr<Operation> op;
  {
    absl::MutexLock lock(&mu_);
    // Draining comes first: the training that still runs is being stopped,
    // so "another is running" would send the caller to wait for nothing.
    if (stopping_) {
      return absl::UnavailableError(
          "memprofd is shutting down; retry against another instance");
    }
    if (training_active_) {
      return absl::AbortedError(
          "another training operation is queued or running; wait for it or cancel it "
          "(ListOperations shows it)");
    }
    training_active_ = true;
    op = operations_.Create(OperationKind::kTrain);
    // Data parallel: the followers get the merged options and the request's
    // own offload fields (each merges them over its own flags), published
    // by the owner thread when it starts the run, in the order it runs
    // things.
    queue_.push_back([this, op, train, offload_options, vocab_size, resumed_tokens,
                      in_request, resume = spec.resume,
                      command = TrainCommand(train, spec.offload, spec.resume)] {
      absl::StatusOr<TrainingData> read =
          in_request ? absl::StatusOr<TrainingData>(*in_request)
                     : ReadTrainingData(train, vocab_size, resumed_tokens,
                                        ClientDataAccess(data_roots_, options_, op));
      if (!read.ok()) {
        {
          absl::MutexLock lock(&mu_);
          training_active_ = false;
        }
        op->Finish(read.status());
        return;
      }
      if (!command.empty()) {
        if (absl::Status s = PublishCommand(command); !s.ok()) {
          {
            absl::MutexLock lock(&mu_);
            training_active_ = false;
          }
          op->Finish(s);
          FailRun(s);
          return;
        }
      }
      RunTraining(op, train, offload_options, *read->data, read->eval_data.get(), resume);
    });
  }
  return op;
}

void Session::RunTraining(const std::shared_ptr<Operation>& op, const TrainOptions& train,
                          const offload::OffloadOptions& offload_options,
                          const TokenDataset& data, const TokenDataset* eval_data,
                          bool resume) {
  // The flag clears before the operation reports done, so that a client that
  // saw it finish can start the next training at once.
  auto finish = [this, &op](absl::Status status, OperationResult result = {}) {
    {
      absl::MutexLock lock(&mu_);
      training_active_ = false;
    }
    op->Finish(std::move(status), std::move(result));
  };
  // Data parallel: every rank runs what rank 0 runs, so a cancel before the
  // start is left to the first step boundary, which all ranks see alike.
  if (group_ == nullptr && op->cancel_requested()) {
    finish(absl::CancelledError("cancelled before it started"), TrainResult{});
    return;
  }
  op->MarkRunning();
  if (!offloader_ || offloader_->options() != offload_options) {
    offloader_.reset();
    absl::StatusOr<std::unique_ptr<offload::Offloader>> created =
        offload::Offloader::Create(offload_options, c10::Device(device_));
    if (!created.ok()) {
      finish(created.status());
      return;
    }
    offloader_ = *std::move(created);
  }
  offload::Offloader* offloader = offloader_.get();
  // The model is on its device by now, so the CUDA allocator is set up and
  // takes the observer; an allocation failure before this run is stale.
  if (!c10::Device(device_).is_cpu()) memory::InstallCudaOomObserver();
  memory::TakeOomCapture();

  offload::OffloadStats step_offload;
  StepHooks hooks;
  hooks.body_scope = [offloader] {
    return std::static_pointer_cast<void>(
        std::make_shared<offload::OffloadScope>(offloader));
  };
  // The head runs inside the offload scope too, so that its saved tensors are
  // counted; unless offload_head, a nested NoOffloadScope keeps them on the
  // device (little compute, large activations that backward needs first).
  hooks.head_scope = [offloader, offload_head = offload_options.offload_head] {
    struct HeadScope {
      explicit HeadScope(offload::Offloader* o) : offload(o) {}
      offload::OffloadScope offload;
    };
    struct ExemptHeadScope {
      explicit ExemptHeadScope(offload::Offloader* o) : offload(o) {}
      offload::OffloadScope offload;
      offload::NoOffloadScope exempt;  // destroyed first
    };
    return offload_head
               ? std::static_pointer_cast<void>(std::make_shared<HeadScope>(offloader))
               : std::static_pointer_cast<void>(
                     std::make_shared<ExemptHeadScope>(offloader));
  };
  hooks.after_forward = [offloader] { offloader->MarkForwardEnd(); };
  hooks.before_step = [this, offloader](int64_t) {
    std::vector<at::Tensor> pinned = model_->Parameters();
    for (const auto& b : model_->Buffers()) pinned.push_back(b);
    offloader->BeginStep(pinned);
  };
  hooks.after_step = [offloader, &step_offload](StepReport&) {
    step_offload = offloader->EndStep();
  };
  hooks.on_failure = [this](const absl::Status& status, int64_t global_step) {
    if (!absl::IsResourceExhausted(status)) return;
    // Memory may still be short: a report that cannot be built must not take
    // the owner thread down with it.
    try {
      RecordOutOfMemory(status, global_step);
    } catch (const std::exception& e) {
      LogWarning(
          absl::StrCat("step ", global_step,
                       " ran out of memory; no OOM report could be built: ", e.what()));
    }
  };
  trainer_->set_hooks(hooks);

  // Data parallel: every rank takes rank 0's weights and optimizer state and
  // averages gradients in buckets during backward (DataParallel); a failure
  // of the run is recorded here and ends it at the next boundary.
  std::unique_ptr<DataParallel> data_parallel;
  absl::Status run_failure;
  if (group_ != nullptr) {
    absl::StatusOr<std::unique_ptr<DataParallel>> attached =
        DataParallel::Attach(group_.get(), trainer_.get());
    if (!attached.ok()) {
      trainer_->set_hooks(StepHooks());
      finish(attached.status());
      FailRun(attached.status());
      return;
    }
    data_parallel = *std::move(attached);
    absl::MutexLock lock(&mu_);
    counters_.data_parallel.active = true;
  }

  const int64_t steps = train.steps;
  const std::vector<std::shared_ptr<SessionObserver>> observers = Observers();
  auto on_step = [&](const StepReport& report) {
    SessionStepReport r;
    r.step = report;
    r.offload = step_offload;
    r.peak_allocated_bytes = StepPeakBytes(device_);
    op->AppendEvent(r);
    for (const auto& observer : observers) observer->OnStep(r);
    std::optional<double> drift;
    if (data_parallel != nullptr && run_failure.ok() &&
        (report.global_step % kDriftEverySteps == 0 || report.step == steps)) {
      absl::StatusOr<double> d = data_parallel->Drift();
      if (d.ok()) {
        drift = *d;
      } else {
        run_failure = d.status();
      }
    }
    op->SetProgress(report.step, steps, "steps",
                    absl::StrFormat("step %d/%d, loss %.4f, %.0f tokens/s", report.step,
                                    steps, report.loss, report.tokens_per_second));
    {
      absl::MutexLock lock(&mu_);
      counters_.steps_total += 1;
      counters_.tokens_total += report.tokens;
      counters_.last_loss = report.loss;
      counters_.has_loss = true;
      counters_.offload_totals.Add(step_offload);
      counters_.last_step = r;
      if (model_summary_) model_summary_->steps_trained = report.global_step;
      if (data_parallel != nullptr) {
        DataParallelCounters& dp = counters_.data_parallel;
        const GradientSyncStats& sync = data_parallel->last_step();
        dp.allreduce_bytes = sync.bytes;
        dp.buckets = sync.buckets;
        dp.buckets_overlapped = sync.buckets_started_in_backward;
        dp.allreduce_exposed_seconds = sync.exposed_seconds;
        dp.allreduce_exposed_seconds_total += sync.exposed_seconds;
        if (drift) {
          dp.parameter_drift = drift;
          dp.drift_checks_total += 1;
        }
      }
    }
    if (report.eval) CountEvaluation(*report.eval);
    PublishCategories();
    PublishRun();
    RecordStepPeaks(r);
    MaybeQueuePeriodicSnapshot(report.global_step);
  };
  auto cancelled = [&] {
    // Step boundary: snapshots and other boundary work run here.
    if (data_parallel == nullptr) {
      RunBoundaryWork();
      return op->cancel_requested();
    }
    if (!run_failure.ok()) return true;
    absl::StatusOr<bool> stop = SyncStepBoundary(op);
    if (!stop.ok()) run_failure = stop.status();
    return !stop.ok() || *stop;
  };
  // The op half of attribution for the training's lifetime (every thread's
  // ops, autograd's included; the module scopes come from the forward).
  memory::OpAttribution op_attribution;
  // A cancel (or shutdown) stops a single-process step between micro-batches;
  // data-parallel ranks stop together at the step boundary (SyncStepBoundary).
  if (data_parallel == nullptr) {
    trainer_->set_step_interrupt([op] { return op->cancel_requested(); });
  }
  const int64_t nonfinite_before = trainer_->nonfinite_steps();
  absl::StatusOr<TrainResult> result =
      resume ? trainer_->ContinueRun(train, data, on_step, cancelled, eval_data)
             : trainer_->Run(train, data, on_step, cancelled, eval_data);
  data_parallel.reset();  // puts the hooks and the data shard back
  trainer_->set_hooks(StepHooks());
  trainer_->set_step_interrupt({});
  if (const int64_t n = trainer_->nonfinite_steps() - nonfinite_before; n > 0) {
    absl::MutexLock lock(&mu_);
    counters_.nonfinite_steps_total += n;
  }
  PublishCategories();
  PublishRun();
  if (group_ != nullptr) {
    // A step that failed on one rank leaves the others in a collective that
    // will not complete: the run cannot go on. (Bad options fail alike on
    // every rank before any collective, and do not break it.)
    absl::Status failure = !run_failure.ok() ? run_failure : result.status();
    if (!failure.ok() && !absl::IsInvalidArgument(failure)) {
      finish(failure);
      FailRun(failure);
      return;
    }
  }
  if (!result.ok()) {
    finish(result.status());
  } else if (result->cancelled) {
    finish(absl::CancelledError(absl::StrCat("cancelled after ", result->steps_completed,
                                             " of ", steps, " steps")),
           *result);
  } else {
    finish(absl::OkStatus(), *result);
  }
}

}  // namespace memprofd
