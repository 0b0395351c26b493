#ifndef MEMPROFD_CORE_SESSION_SESSION_H_
#define MEMPROFD_CORE_SESSION_SESSION_H_

// The daemon's engine: one owner thread that runs everything touching the
// model (loads, training steps, snapshots), the registry of operations it
// works through, and the state it publishes for readers. RPC handlers never
// block on it: they validate, enqueue work, get an Operation back, and read
// published copies.
//
// The session is a thin door over parts with one purpose each, whose headers
// say what they are for, which thread may call what, and their invariants:
// OwnerThread (owner_thread.h) runs the model's work in order; ModelHost
// (model_host.h) holds the model, its trainer and offloader, loads and
// publishes its summary; SnapshotScheduler (snapshot_scheduler.h) runs the
// step-boundary work, snapshots and retention; RankCoordinator
// (rank_coordinator.h) is this rank's seat in a data-parallel run;
// OomReporter (oom_reporter.h) keeps OOM reports and step peaks; operations
// live in OperationRegistry (operation.h), and memory is read through the
// process's Runtime (runtime.h); a training, once its request is checked,
// is Training's (training.h): admission, start and run. What is left here:
// the checks of each request (the doors), evaluations and plans, and the
// counters and observers every part is handed (session_counters.h).
//
// Thread-safety: every public method may be called from any thread. Work on
// the model runs on the owner thread only. The session's lock guards the
// admission of trainings and plans; the counters, the observers, the
// training slot and the model host's published copies each have their own
// lock, and none is held while calling out, so no two nest.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/common/files.h"
#include "core/memory/breakdown.h"
#include "core/memory/memory_stats.h"
#include "core/session/followed_commands.h"
#include "core/session/operation.h"
#include "core/session/session_counters.h"
#include "core/session/session_types.h"
#include "core/session/training_slot.h"

namespace memprofd {

class DataParallel;
class ModelHost;
class OomReporter;
class OwnerThread;
class Runtime;
class RankCoordinator;
class SnapshotScheduler;
class TokenDataset;
class Training;

class Session : private FollowedCommands {
 public:
  // Validates the options (ValidateSessionOptions), resolves the device and
  // prepares `runtime` for it (the process's memory accounting and offload
  // engine, made once by main: runtime.h), cleans leftover temporary
  // snapshot directories, and loads the start model on the owner thread
  // (blocking until it is loaded). `runtime` outlives the session. Errors:
  // the options' INVALID_ARGUMENT, the device's (see ResolveDevice), the
  // model's (INVALID_ARGUMENT for an unknown preset, NOT_FOUND / DATA_LOSS
  // for a directory).
  static absl::StatusOr<std::unique_ptr<Session>> Create(const SessionOptions& options,
                                                         Runtime& runtime);

  // Shutdown(), then joins the owner and any async snapshot writer.
  ~Session() override;

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& device() const { return device_; }
  absl::Time start_time() const { return start_time_; }

  // Data parallel (RankCoordinator, rank_coordinator.h). In a run of
  // several ranks, rank 0 serves the whole API and hands every Train and
  // LoadModel to the other ranks, which follow it step by step; they serve
  // only what reads (status, memory, operations, snapshots' listing): Train,
  // LoadModel, Snapshot, DeleteSnapshot, Evaluate and CancelOperation there
  // are FAILED_PRECONDITION naming rank 0. A world of one rank is a single
  // process, as before.
  const WorldSpec& world() const;
  // SessionOptions::bulk_nice, for the server's own bulk work.
  int bulk_nice() const { return options_.bulk_nice; }
  bool follower() const;
  // Called once, from the thread that saw it, when the data-parallel run is
  // broken (a collective failed or timed out, a rank died or left): the
  // operation has failed with that status and the session will not train
  // again; the daemon should stop serving and exit non-zero, so that the
  // launcher restarts every rank (and they resume from the last checkpoint).
  // Set it before training starts.
  void SetFatalHandler(std::function<void(const absl::Status&)> handler);
  // Set once the run is broken (see SetFatalHandler).
  std::optional<absl::Status> fatal_status() const;
  // Every rank's memory (rank 0's now, the others' as they last published
  // it, about once a second, read from the store by rank 0's reader thread
  // so that this never waits on the store), with the spread across ranks.
  // On a single process, that process alone. FAILED_PRECONDITION on a
  // follower.
  absl::StatusOr<MemoryAcrossRanks> MemoryOfAllRanks() const;
  // For tests that drive operations by hand (the server's stream tests).
  OperationRegistry& operations_for_testing() { return operations_; }

  // Queues a model load (LOAD_MODEL operation). INVALID_ARGUMENT for a spec
  // without exactly one source or with resume but no hf_directory,
  // FAILED_PRECONDITION while training runs, UNIMPLEMENTED for placements
  // this build cannot honour. With resume, the operation fails with
  // FAILED_PRECONDITION naming what is missing when the directory is not a
  // checkpoint (weights only) or its optimizer state is of another model,
  // and DATA_LOSS when a checkpoint file is corrupt; the loaded model stays
  // as it was on every failure.
  absl::StatusOr<std::shared_ptr<Operation>> LoadModel(const LoadModelSpec& spec);

  // Merges the request over the defaults (TrainOptions', the daemon's
  // offload flags), validates, and queues training (TRAIN operation; events
  // are SessionStepReport, result TrainResult). INVALID_ARGUMENT for bad
  // options or data (read here, so the caller learns at once),
  // FAILED_PRECONDITION without a model, ABORTED while another training is
  // queued or running. With spec.resume: INVALID_ARGUMENT for a seed other
  // than the run's; FAILED_PRECONDITION when the model
  // has no run to continue, when that run is complete and steps is unset, or
  // when its data source (reused) no longer has the same number of tokens.
  // With spec.memory_budget_bytes: INVALID_ARGUMENT when <= 0, UNIMPLEMENTED
  // with resume or in a data-parallel run; otherwise the operation is made
  // and holds the training's place at once (a second Train is ABORTED as
  // above), its configuration is chosen on the plan thread
  // (plan::ChooseUnderBudget over the merged options; queued behind a
  // memory plan that is running), and then it runs on the owner thread with
  // the chosen batch_size, grad_accumulation_steps, gradient_checkpointing
  // and offloading, exactly as a Train with those fields. When nothing fits
  // the operation fails with the chooser's RESOURCE_EXHAUSTED before the
  // run allocates anything; the planner's other errors fail it likewise.
  // The choice and its planned peak are in the first step report and the
  // TrainResult.
  // Calibration: a Train without a budget also has its configuration
  // planned on the plan thread just before the run starts there (a dry run
  // of at most two micro-batches per step, each rank's in a data-parallel
  // run: milliseconds to a fraction of a second), so that the plan's real
  // CPU bytes and its cores never overlap the run's steps. It is also the
  // run's admission (Training::Calibrate), so a run queues behind a PlanMemory or
  // another training's calibration (each bounded and cancellable) rather
  // than skip it. In a data-parallel run rank 0 admits the run for every
  // rank, on its own device's room and its own planned peak. Step reports
  // carry planned_peak_bytes (this rank's) and the counters
  // plan_error_ratio. A PlanMemory that comes meanwhile queues behind it.
  // Under a budget, the chosen configuration's plan admits the run as
  // calibration does.
  absl::StatusOr<std::shared_ptr<Operation>> StartTraining(const TrainSpec& spec);

  // Merges the request over EvalOptions' defaults, validates, reads the
  // data, and queues an evaluation of the model as it is at the next step
  // boundary (EVALUATE operation; result EvalResult): at once when idle,
  // between two steps while training runs. INVALID_ARGUMENT for bad options
  // or data (read here), FAILED_PRECONDITION without a model.
  absl::StatusOr<std::shared_ptr<Operation>> StartEvaluation(const EvalSpec& request);

  // Queues a snapshot at the next step boundary (SNAPSHOT operation; result
  // SnapshotResult). INVALID_ARGUMENT for a bad name, a checkpoint with a
  // converting dtype (CheckCheckpointDtype),
  // ALREADY_EXISTS when taken, FAILED_PRECONDITION without a model or a
  // snapshot root.
  absl::StatusOr<std::shared_ptr<Operation>> StartSnapshot(const SnapshotSpec& spec);

  // Plans one training step of a model on the meta device
  // (plan::PlanTrainingStep, core/plan/planner.h) as a PLAN operation
  // (result PlanResult), on the session's plan thread (mpd-plan), never the
  // owner thread: a plan runs beside a training and never waits for it. One
  // plan at a time. Checked here, once: the target, capacity_bytes >= 0, no
  // resume, the offload merge, and for the loaded model or a preset the
  // training fields (MergeTrainOverrides over TrainOptions' defaults, steps
  // unset taken as the default). INVALID_ARGUMENT for those and an unknown
  // preset or both sources; FAILED_PRECONDITION with no source and no model
  // loaded; RESOURCE_EXHAUSTED naming the plan that is queued or running;
  // UNAVAILABLE once Shutdown has begun. hf_config_dir is confined and its
  // config.json read on the plan thread (ModelHost::ReadClientConfig), and
  // the training fields merged there: their errors fail the operation, as
  // do the planner's (UNIMPLEMENTED for bf16, INTERNAL for an op without a
  // meta kernel). A cancelled plan that is running ends
  // CANCELLED when its dry run is over (the planner cannot stop midway).
  absl::StatusOr<std::shared_ptr<Operation>> StartPlan(const PlanMemorySpec& spec);

  absl::StatusOr<std::vector<snapshot::SnapshotManifest>> ListSnapshots() const;
  absl::StatusOr<snapshot::SnapshotManifest> DescribeSnapshot(
      const std::string& name) const;
  absl::Status DeleteSnapshot(const std::string& name);

  // Operations (LOAD_MODEL, TRAIN, SNAPSHOT, EVALUATE). NOT_FOUND for an
  // unknown id.
  absl::StatusOr<std::shared_ptr<Operation>> GetOperation(const std::string& id) const;
  // A TRAIN operation, whose events are its step reports: GetOperation's
  // errors, and INVALID_ARGUMENT for an operation of another kind.
  absl::StatusOr<std::shared_ptr<Operation>> GetTrainingOperation(
      const std::string& id) const;
  // How long a wait for operation changes may block: `timeout` unset (or
  // zero) is the longest, kMaxOperationWait; longer ones are cut to it.
  // INVALID_ARGUMENT for a negative timeout.
  static absl::StatusOr<absl::Duration> OperationWaitTimeout(
      std::optional<absl::Duration> timeout);
  static constexpr absl::Duration kMaxOperationWait = absl::Seconds(60);
  // Newest first; `kind` unset lists every kind.
  std::vector<std::shared_ptr<Operation>> ListOperations(
      std::optional<OperationKind> kind, bool active_only) const;
  // Asks operation `id` to stop (training stops at its next step boundary).
  // NOT_FOUND for an unknown id, FAILED_PRECONDITION when it is already done.
  absl::StatusOr<std::shared_ptr<Operation>> CancelOperation(const std::string& id);
  int64_t ActiveOperationCount() const;

  // Memory, through the process's recorder (every allocation and free the
  // accounting sees). Thread-safe.
  memory::MemoryStatsView MemoryStats() const;
  void ResetPeakMemory();
  // Starts recording the history of allocations and frees, keeping the newest
  // `max_entries` (unset: kDefaultHistoryEntries). INVALID_ARGUMENT for
  // max_entries < 1.
  absl::Status StartMemoryRecording(std::optional<int64_t> max_entries);
  // Stops recording; the history is kept for DumpMemoryHistory until `clear`.
  void StopMemoryRecording(bool clear);
  // The history (and on CUDA the allocator's segments and trace) as a
  // memory_viz pickle. FAILED_PRECONDITION when nothing was recorded.
  absl::StatusOr<std::string> DumpMemoryHistory() const;
  static constexpr int64_t kDefaultHistoryEntries = 100000;
  // Live bytes now and the last step's peaks on the compute device by module,
  // op or category (see memory/breakdown.h), with the offloaded bytes
  // outside the allocator. INVALID_ARGUMENT for a bad request (the message
  // names the field). Thread-safe.
  absl::StatusOr<memory::MemoryBreakdown> MemoryBreakdown(
      const memory::BreakdownRequest& request) const;
  // What grew between two of the last kStepRecords steps, by module and
  // category. INVALID_ARGUMENT for steps < 1 or a bad top; NOT_FOUND for a
  // step no longer (or not yet) kept. Thread-safe.
  absl::StatusOr<memory::MemoryDiff> DiffMemory(int64_t step_a, int64_t step_b,
                                                std::optional<int64_t> top) const;
  // Live bytes on the compute device by module kind and category, for
  // metrics. Thread-safe; O(attributed cells).
  memory::ModuleKindBytes MemoryByModuleKind() const;

  // The report of the newest training step that ran out of memory since
  // start (a copy). NOT_FOUND when none did.
  absl::StatusOr<OomReportRecord> LastOomReport() const;

  // Published copies.
  std::optional<ModelSummary> Model() const;
  // The loaded model; FAILED_PRECONDITION when none is.
  absl::StatusOr<ModelSummary> DescribeModel() const;
  SessionCounters Counters() const;

  // Tells `observer` of every step of the trainings started after this call
  // and of every snapshot published after it (see SessionObserver); the
  // session keeps it alive. Add observers before training starts.
  void AddObserver(std::shared_ptr<SessionObserver> observer);

  // Runs `work` on the owner thread, after the work queued before it.
  // UNAVAILABLE once Shutdown has begun.
  absl::Status Post(std::function<void()> work);

  // The drain's first moment (SIGTERM): from here on draining() is true
  // (status says DRAINING) and every new operation a client asks for is
  // UNAVAILABLE. With `snapshot_name` set, first queues a snapshot of that
  // name (of SessionOptions::auto_snapshot_kind) for the next step
  // boundary; then asks every active operation to stop
  // (Operation::RequestDrain: a training stops at that boundary, after the
  // snapshot, and ends ABORTED with reason DRAINING naming the checkpoint
  // to resume from); then waits for the snapshot to be written. Returns the
  // snapshot's status (queueing it, or writing it), OK without one. Only
  // the first call does anything; later ones return OK at once. Any thread
  // but the owner thread.
  absl::Status BeginDrain(const std::string& snapshot_name = "");
  // BeginDrain (without a snapshot, if it was not called), then stops
  // accepting work, lets queued items finish (as the drain stopped them),
  // joins the owner thread and the plan thread. A plan that is running is
  // waited for (a dry run cannot stop midway: seconds for most shapes, up
  // to about a minute for a 70B one; the daemon's drain deadline bounds the
  // wait). Idempotent.
  void Shutdown();
  // True from BeginDrain's first moment.
  bool draining() const;

 private:
  Session(const SessionOptions& options, Runtime& runtime, std::string device,
          PathRoots data_roots, PathRoots model_roots);

  // Data parallel: the session's side (session_dist.cc); the rest is
  // ranks_'s. After the start model loaded: every rank checks it holds rank
  // 0's model and takes its weights and optimizer state (owner thread).
  absl::Status AlignWithRankZero();
  // The follower's thread (FollowedCommands): queue rank 0's
  // LoadModel or Train as an operation on the owner thread. FollowLoad:
  // Post's UNAVAILABLE once Shutdown has begun. FollowTrain: CANCELLED once
  // Shutdown has begun, the offload merge's and the data's errors (naming
  // this rank), FAILED_PRECONDITION without a model.
  absl::Status FollowLoad(const LoadModelSpec& spec) override;
  absl::Status FollowTrain(const TrainOptions& train,
                           const offload::OffloadOverrides& offload_request,
                           bool resume) override;

  // Evaluates on `in_request` (the data the request carried, checked), or
  // reads options.data first (a file: bad data fails `op`).
  void RunEvaluation(const std::shared_ptr<Operation>& op, const EvalOptions& options,
                     std::shared_ptr<const TokenDataset> in_request);
  // Plan thread only (session_plan.cc): runs plan `op` of `spec` (model and
  // training filled in when `ready`, else read from spec.hf_config_dir
  // first) and finishes it.
  void RunPlan(const std::shared_ptr<Operation>& op, const PlanMemorySpec& spec,
               plan::PlanSpec base, bool ready, const std::string& model_name);

  const SessionOptions options_;
  // The process's memory accounting: every memory figure is read through
  // runtime_.recorder().
  Runtime& runtime_;
  const std::string device_;
  // Where client-named data files may lead (SessionOptions::data_roots).
  const PathRoots data_roots_;
  const absl::Time start_time_;
  OperationRegistry operations_;

  // Set by the first BeginDrain.
  std::atomic<bool> drain_begun_{false};

  // The one training at a time: its ticket goes with the training's work
  // from admission to its end (training_slot.h).
  TrainingSlot training_slot_;

  mutable absl::Mutex mu_;
  // The id of the PLAN operation queued or running on plans_; empty: none.
  std::string plan_active_ ABSL_GUARDED_BY(mu_);
  // What every part counts (Counters() adds the live figures) and whom it
  // tells of steps and snapshots.
  CounterBoard counters_;
  ObserverList observers_;

  // Runs the work posted (Post) and, after each item, the boundary work.
  // Made first, started last in the constructor (with the snapshot
  // scheduler's boundary work); stopped and joined by Shutdown.
  std::unique_ptr<OwnerThread> owner_;
  // The plan thread (mpd-plan): the same one-item-at-a-time queue as the
  // owner's, for memory plans, which touch no model and so never wait for
  // the owner. Started with owner_; stopped and joined by Shutdown.
  std::unique_ptr<OwnerThread> plans_;
  // The loaded model, its trainer and offloader, and their published
  // summary (ModelHost, model_host.h). Always set; made before the owner
  // thread starts, released by the destructor once the owner thread and the
  // snapshot writers are joined.
  std::unique_ptr<ModelHost> host_;

  // Snapshots (SnapshotScheduler, snapshot_scheduler.h): the step-boundary
  // queue (evaluations wait there too), snapshot writing and its async
  // writers, retention, and what DeleteSnapshot must leave alone. Always
  // set; made before the owner thread starts, its writers joined by the
  // destructor.
  std::unique_ptr<SnapshotScheduler> snapshots_;

  // Data parallel: the process group, the follower's and rank-memory
  // threads, the per-step agreement and the broken-run state. Always set
  // (from the constructor), a world of one rank included: there it holds no
  // group and no threads, and what the session asks of it (CheckLeader,
  // fatal_status, MemoryOfAllRanks, the empty commands) needs no null checks
  // at every call site. Made before the owner thread starts.
  std::unique_ptr<RankCoordinator> ranks_;
  // OOM reports, the steps' peaks behind them and the peak file: the
  // training run's step listener records into it. Made before the owner
  // thread starts.
  std::unique_ptr<OomReporter> oom_;
  // Training operations past their door (training.h). Made last: it reaches
  // every part above.
  std::unique_ptr<Training> training_;
};

// Resolves "auto", "cpu", "cuda", "cuda:N" against this build and machine.
// "auto" (with a GPU) and "cuda" mean cuda:`local_rank`: the rank's own GPU
// on its host, as torchrun's convention has it (0 for a single process).
// INVALID_ARGUMENT for an unparsable name; UNIMPLEMENTED for cuda on a build
// without CUDA; FAILED_PRECONDITION for a GPU that is not there.
absl::StatusOr<std::string> ResolveDevice(const std::string& requested,
                                          int local_rank = 0);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_SESSION_H_
