#ifndef MEMPROFD_CORE_SESSION_TRAINING_H_
#define MEMPROFD_CORE_SESSION_TRAINING_H_

// Training operations, from the door to the end of the run.
//
// Session::StartTraining is the door: it checks and merges the request, takes
// the training's ticket (training_slot.h), admits the operation and hands it
// over here (Admit). From there a training goes through named stages, each on
// its thread:
//   1. Plan (the plan thread): under a budget, the configuration the planner
//      chooses (PlanUnderBudget); otherwise the calibration plan of the one
//      given (Calibrate). A step that cannot fit is refused here, before it
//      allocates anything.
//   2. Start (the owner thread): the data read (client files confined to the
//      data roots, cancellable), then the command published to the other
//      ranks.
//   3. Run (the owner thread): the trainer's run with the offloader, data
//      parallel, and this operation's step listener (reports, counters,
//      boundary work, OOM reports).
// The ticket goes with the training through every stage; the stage that ends
// it finishes the operation through the ticket, the one place the slot is
// given back. A follower's training (rank 0's command) enters at stage 3
// (Follow).
//
// Thread-safety: Admit and Follow from any thread; the stages run on the
// threads named above.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "core/common/files.h"
#include "core/model/config.h"
#include "core/offload/offload_options.h"
#include "core/session/operation.h"
#include "core/session/session_types.h"
#include "core/session/training_data.h"
#include "core/session/training_slot.h"
#include "core/train/train_options.h"

namespace memprofd {

class CounterBoard;
class DataParallel;
class ModelHost;
class ObserverList;
class OomReporter;
class OwnerThread;
class RankCoordinator;
class Runtime;
class SnapshotScheduler;
class TokenDataset;

namespace plan {
struct MemoryPlan;
}  // namespace plan

class Training {
 public:
  // What a training reaches beyond itself: the session's parts, made before
  // it and outliving it (the session joins its threads before it goes).
  struct Parts {
    const SessionOptions& options;
    const std::string& device;
    const PathRoots& data_roots;
    Runtime& runtime;
    ModelHost& host;
    RankCoordinator& ranks;
    SnapshotScheduler& snapshots;
    OomReporter& oom;
    OwnerThread& owner;
    OwnerThread& plans;
    CounterBoard& counters;
    ObserverList& observers;
  };

  // A training the door admitted: its operation and ticket, and the checked
  // request.
  struct Admitted {
    explicit Admitted(ValidTrainOptions train) : train(std::move(train)) {}

    std::shared_ptr<Operation> op;
    std::shared_ptr<TrainingSlot::Ticket> ticket;
    // The options to run (a budget may choose others) and the model's
    // config they were checked for.
    ValidTrainOptions train;
    LlamaConfig config;
    // The dtype of the model's base when the run was admitted (its plans
    // make the model so).
    BaseDtype base_dtype = BaseDtype::kFloat32;
    // The offload options merged over the daemon's flags, and the request's
    // own fields (what the followers merge over theirs).
    offload::OffloadOptions offload;
    offload::OffloadOverrides offload_request;
    // Set: choose the configuration under this many bytes.
    std::optional<int64_t> budget_bytes;
    // Continue the loaded run; with the token count its data source had
    // (set when the request names no other source).
    bool resume = false;
    std::optional<int64_t> resumed_tokens;
    // The data the request carried, already read and checked; unset when it
    // names a file (read in stage 2).
    std::optional<TrainingData> in_request;
  };

  explicit Training(Parts parts);
  ~Training();
  Training(const Training&) = delete;
  Training& operator=(const Training&) = delete;

  // Stage 1, queued on the plan thread. The plan thread's UNAVAILABLE once
  // shutdown has begun; the operation is then finished with it.
  absl::Status Admit(Admitted admitted);

  // A follower's training: runs rank 0's command (checked by this rank,
  // its data read) on the owner thread, as operation `op` holding `ticket`.
  // The owner thread's UNAVAILABLE once shutdown has begun; the operation
  // is then finished with it.
  absl::Status Follow(std::shared_ptr<Operation> op,
                      std::shared_ptr<TrainingSlot::Ticket> ticket,
                      const ValidTrainOptions& train,
                      const offload::OffloadOptions& offload, TrainingData data,
                      bool resume);

  // A fully sharded run leaves the model sharded (each rank its shards
  // only), with its data parallel state kept here and the parameters handed
  // to RankCoordinator::KeepShardedModel for what reads them between runs.
  // The next run goes on from them (Run; full sharding refuses adapters,
  // the one thing a run would change the model by). MakeModelWhole gathers
  // it whole again (one collective per parameter group) before a load
  // replaces the model.
  // Every rank, owner thread, at the same point; OK at once when the model
  // is whole. Its error breaks the run (the caller calls FailRun).
  absl::Status MakeModelWhole();
  // At shutdown, before the model goes: drops what MakeModelWhole would
  // gather (no collective; the model is unusable after).
  void DropShardedModel();

 private:
  class StepReporter;
  // What a training run was planned at: a budgeted run's choice (set by the
  // plan thread before the run starts) and the planned peak of the run's
  // configuration. Shared by the plan thread and the run's step reporter,
  // which reads it at each step.
  struct Plan {
    std::string budget_choice;                   // empty: no budget
    std::atomic<int64_t> planned_peak_bytes{0};  // 0: not planned (yet)
  };

  // Stage 1 (plan thread).
  void PlanUnderBudget(const std::shared_ptr<const Admitted>& admitted,
                       const std::shared_ptr<Plan>& plan);
  void Calibrate(const std::shared_ptr<const Admitted>& admitted,
                 const std::shared_ptr<Plan>& plan);
  // OK when a step planned as `planned` can fit what the compute device has
  // free now (with what this process already holds there);
  // RESOURCE_EXHAUSTED naming the planned peak otherwise. OK when the room
  // is unknown.
  absl::Status StepFits(const plan::MemoryPlan& planned) const;
  // This rank's planned peak in `planned` (its RankPlan's; the plan's peak
  // when the rank was not planned on its own).
  int64_t OwnPlannedPeak(const plan::MemoryPlan& planned) const;
  // Stage 2: queues the start of `admitted` with the options stage 1 chose
  // on the owner thread. The owner thread's UNAVAILABLE once shutdown has
  // begun (the caller finishes the operation).
  absl::Status Start(const std::shared_ptr<const Admitted>& admitted,
                     const ValidTrainOptions& train,
                     const offload::OffloadOptions& offload,
                     const std::shared_ptr<Plan>& plan);
  // Stage 3 (owner thread): runs training `op` and finishes it through
  // `ticket`.
  void Run(const std::shared_ptr<Operation>& op,
           const std::shared_ptr<TrainingSlot::Ticket>& ticket,
           const ValidTrainOptions& train, const offload::OffloadOptions& offload,
           const TrainingData& data, bool resume, std::shared_ptr<const Plan> plan);

  // Keeps a fully sharded run's data parallel state after it, and takes it
  // back (for the next run, or to gather the model whole): the
  // coordinator's parameters and the counters follow.
  void KeepShardedModel(std::unique_ptr<DataParallel> data_parallel);
  std::unique_ptr<DataParallel> TakeShardedModel();

  const Parts parts_;
  // Owner thread: the last fully sharded run's data parallel state, while
  // the model stays sharded (above); null when it is whole.
  std::unique_ptr<DataParallel> sharded_model_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_TRAINING_H_
