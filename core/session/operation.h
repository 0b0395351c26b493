#ifndef MEMPROFD_CORE_SESSION_OPERATION_H_
#define MEMPROFD_CORE_SESSION_OPERATION_H_

// Long-running work (training, snapshots, loads, evaluations, memory plans)
// as an Operation with an id:
// queued, running, then done with a result or an error. The shape of
// google.longrunning.Operation; the server maps it to memprofd.v1.Operation.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/session/session_types.h"

namespace memprofd {

enum class OperationKind {
  kTrain = 1,
  kSnapshot = 2,
  kLoadModel = 3,
  kEvaluate = 4,
  kPlan = 5,
};
enum class OperationState {
  kQueued = 1,
  kRunning = 2,
  kSucceeded = 3,
  kFailed = 4,
  kCancelled = 5,
};

// Operation.error.reason of an operation the daemon stopped because it was
// shutting down (its error is then ABORTED): a program that sees it knows
// the work was interrupted, not refused or cancelled, and may go on with it
// once a daemon serves again (a training: Train with resume).
inline constexpr absl::string_view kDrainingReason = "DRAINING";

// What a finished operation leaves behind, by kind: TrainResult for TRAIN
// (kept also when cancelled: the steps that did run), ModelSummary for
// LOAD_MODEL, SnapshotResult for SNAPSHOT, EvalResult for EVALUATE,
// PlanResult for PLAN. std::monostate until done, and for failures.
using OperationResult = std::variant<std::monostate, TrainResult, ModelSummary,
                                     SnapshotResult, EvalResult, PlanResult>;

// The most bytes of an operation's error message and progress message that
// are kept (and so sent in every Get, Wait, Watch and List): a longer one is
// cut (CapMessage), so that a message built around a client's huge value
// costs neither the daemon's memory nor the clients' message limits. With
// the registry's 256 finished operations this bounds ListOperations' text to
// about 2 MiB.
inline constexpr size_t kMaxOperationMessageBytes = 4096;

// A copy of an operation's state at one moment.
struct OperationView {
  std::string id;
  OperationKind kind = OperationKind::kTrain;
  OperationState state = OperationState::kQueued;
  bool done = false;
  int64_t completed = 0;
  int64_t total = 0;
  std::string unit;
  std::string message;
  absl::Time create_time;
  absl::Time start_time;  // absl::InfinitePast() until it runs
  absl::Time end_time;    // absl::InfinitePast() until done
  // OK unless FAILED or CANCELLED.
  absl::Status error;
  // Why the daemon itself ended the operation, for programs:
  // kDrainingReason, or empty.
  std::string reason;
  // Kept for SUCCEEDED, for CANCELLED and for an operation stopped by the
  // drain (reason set): the steps a training did run.
  OperationResult result;
  // Bumped on every change; lets watchers wait for the next one.
  uint64_t version = 0;
};

// One operation. Thread-safe: the owner thread updates it, RPC handlers read
// it, wait on it and subscribe to it.
class Operation {
 public:
  Operation(std::string id, OperationKind kind, size_t max_events);

  const std::string& id() const { return id_; }
  OperationKind kind() const { return kind_; }

  // State changes, for the thread running the work. Finish with OK and a
  // result succeeds; with CANCELLED cancels; with any other status fails.
  // The result is kept also on cancellation (the steps that did run).
  // After RequestDrain (and no RequestCancel before it), a Finish with
  // CANCELLED fails with ABORTED instead, its message saying that memprofd
  // is shutting down, and one with CANCELLED or ABORTED gets the reason
  // kDrainingReason and keeps its result.
  void MarkRunning();
  void SetProgress(int64_t completed, int64_t total, std::string unit,
                   std::string message);
  void Finish(absl::Status status, OperationResult result = {});

  // Appends a training step's report to a bounded log (TRAIN operations);
  // the oldest are dropped past max_events. Events are numbered from 1.
  void AppendEvent(SessionStepReport event);
  // Events with number >= `from` (1-based), at most `max` of them, and the
  // number of the first returned in *first (0 when none).
  std::vector<SessionStepReport> EventsFrom(int64_t from, size_t max,
                                            int64_t* first) const;
  int64_t events_total() const;

  // Cancellation is cooperative: the work polls cancel_requested(), true
  // once RequestCancel (a client's cancel) or RequestDrain (the daemon is
  // shutting down) was called. The first of the two decides how the
  // operation ends (Finish); a later one changes nothing. Both are no-ops
  // on a finished operation.
  void RequestCancel();
  void RequestDrain();
  bool cancel_requested() const;
  // True when RequestDrain came first.
  bool drain_requested() const;

  OperationView View() const;
  bool done() const;

  // Blocks until the version passes `seen_version`, the operation is done,
  // or `deadline`; returns the view then.
  OperationView WaitForChange(uint64_t seen_version, absl::Time deadline) const;

  // Calls `fn` (from the thread that made the change, without locks held)
  // after every change, until Unsubscribe. `fn` must not block.
  int Subscribe(std::function<void()> fn);
  void Unsubscribe(int token);

 private:
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Notify();

  const std::string id_;
  const OperationKind kind_;
  const size_t max_events_;

  mutable absl::Mutex mu_;
  OperationView view_ ABSL_GUARDED_BY(mu_);
  bool cancel_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool drain_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<SessionStepReport> events_ ABSL_GUARDED_BY(mu_);
  int64_t first_event_ ABSL_GUARDED_BY(mu_) = 1;

  mutable absl::Mutex listeners_mu_;
  int next_token_ ABSL_GUARDED_BY(listeners_mu_) = 1;
  std::map<int, std::shared_ptr<std::function<void()>>> listeners_
      ABSL_GUARDED_BY(listeners_mu_);
};

// All operations of the daemon. Keeps every unfinished operation and the
// newest `max_finished` finished ones. Thread-safe.
class OperationRegistry {
 public:
  explicit OperationRegistry(size_t max_finished = 256,
                             size_t max_events_per_operation = 10000);

  // A new QUEUED operation with a fresh id ("op-1", "op-2", ...), for work
  // the daemon starts itself (periodic and shutdown snapshots, a follower
  // rank's copy of rank 0's work): made while draining too.
  std::shared_ptr<Operation> Create(OperationKind kind);
  // The same for a client's request: UNAVAILABLE (saying memprofd is
  // shutting down) once StopAdmitting was called.
  absl::StatusOr<std::shared_ptr<Operation>> Admit(OperationKind kind);
  // The drain's first moment: Admit refuses from now on. Returns the
  // operations not done, taken atomically with the change, so that every
  // client operation is either refused or in the list. Idempotent.
  std::vector<std::shared_ptr<Operation>> StopAdmitting();
  // False once StopAdmitting was called.
  bool admitting() const;

  // NOT_FOUND with a message naming `id` when unknown.
  absl::StatusOr<std::shared_ptr<Operation>> Get(const std::string& id) const;

  // Newest first; `kind` filters when set.
  std::vector<std::shared_ptr<Operation>> List(const OperationKind* kind,
                                               bool active_only) const;

  int64_t ActiveCount() const;

 private:
  std::shared_ptr<Operation> CreateLocked(OperationKind kind)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Prune() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_finished_;
  const size_t max_events_;
  mutable absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool admitting_ ABSL_GUARDED_BY(mu_) = true;
  // In creation order.
  std::vector<std::shared_ptr<Operation>> ops_ ABSL_GUARDED_BY(mu_);
};

absl::string_view OperationKindName(OperationKind kind);
absl::string_view OperationStateName(OperationState state);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_OPERATION_H_
