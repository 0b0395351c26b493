#ifndef MEMPROFD_CORE_SESSION_SNAPSHOT_SCHEDULER_H_
#define MEMPROFD_CORE_SESSION_SNAPSHOT_SCHEDULER_H_

// The session's snapshots: when they run, how they are written, and what may
// be deleted. A snapshot asked for (StartSnapshot, every
// snapshot_every_steps, the shutdown snapshot) waits in the step-boundary
// queue and runs on the session's owner thread at the next step boundary
// (between two training steps, or after the owner's current item when it is
// idle), so that it is a consistent point-in-time copy. A blocking snapshot
// streams the live tensors there; an async one copies them to host memory
// there and is written by a thread of its own ("mpd-snapshot") while
// training goes on. Each published snapshot is counted, told to the
// observers, and followed by retention (keep_last).
//
// The step-boundary queue is the session's, not only the snapshots': the
// session queues its evaluations there too (QueueBoundaryWork), and the rank
// coordinator asks HasBoundaryWork at each boundary of a data-parallel run.
//
// Deleting guards what is in use: the directories LoadModel operations
// queued or running will read (TrackLoad / ForgetLoad). They live here,
// beside the deletion that consults them.
//
// Threads:
// - The session's owner thread: RunBoundaryWork (so every snapshot and
//   evaluation), MaybeQueuePeriodicSnapshot.
// - The async writers, started by RunBoundaryWork's snapshots, joined by
//   Join: the write and its finish (counters, observers, retention).
// - Any thread: the rest.
//
// Invariants:
// - Boundary work runs on the owner thread, in the order queued, each item
//   once; an item is queued only while the owner thread accepts work (the
//   wake-up post succeeded), so every queued item runs.
// - A SNAPSHOT operation finishes exactly once: CANCELLED before it started,
//   the writer's error, or OK with its SnapshotResult after the observers
//   were told.
// - async_staging_bytes() is the host bytes held by async copies not yet
//   written: 0 when no async writer is running.
// - Lock order: the scheduler's lock is held while the owner thread's Post
//   runs (so that an item is queued only once the owner was woken); nothing
//   else is called with it held, and the session never calls in with its own
//   lock held.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/session/boundary_work.h"
#include "core/session/operation.h"
#include "core/session/session_types.h"

namespace at {
class Tensor;
}

namespace memprofd {

class LlamaModel;
class CounterBoard;
class ModelHost;
class ObserverList;
class OwnerThread;
class Trainer;
namespace snapshot {
struct CheckpointPayload;
class TensorAccess;
}  // namespace snapshot

class SnapshotScheduler : public BoundaryWork {
 public:
  // What the scheduler works with: the session's parts, made before it and
  // outliving it. `follower`: this process is a follower rank of a
  // data-parallel run, where rank 0 writes the run's snapshots. `sharded`
  // (the rank coordinator) holds what other ranks keep of the training
  // state. `host` gives the model and trainer a snapshot reads (owner
  // thread) and whether one is loaded; `owner` is woken for boundary work
  // when no training runs; `counters` and `observers` are told of every
  // snapshot that finishes.
  struct Parts {
    const SessionOptions& options;
    bool follower;
    OperationRegistry& operations;
    ShardedState& sharded;
    ModelHost& host;
    OwnerThread& owner;
    CounterBoard& counters;
    ObserverList& observers;
  };

  // `options` uses snapshot_root, snapshot_staging_bytes,
  // snapshot_every_steps, auto_snapshot_kind and keep_last. Starts nothing.
  explicit SnapshotScheduler(Parts parts);
  // Join.
  ~SnapshotScheduler() override;

  SnapshotScheduler(const SnapshotScheduler&) = delete;
  SnapshotScheduler& operator=(const SnapshotScheduler&) = delete;

  // Any thread: queues `work` for the next step boundary and wakes the owner
  // thread, so that it runs at once when no training runs. UNAVAILABLE
  // (post's) once the session is shutting down; nothing is queued then.
  absl::Status QueueBoundaryWork(std::function<void()> work);
  // Any thread: whether work waits for the next step boundary.
  bool HasBoundaryWork() const override;
  // Owner thread: runs the queued boundary work, and what that work queues,
  // until none is left.
  void RunBoundaryWork() override;

  // Session::StartSnapshot after the leader check (a client's snapshot;
  // `daemons_own`: the shutdown snapshot, made while draining too):
  // FAILED_PRECONDITION without a snapshot root or a model,
  // INVALID_ARGUMENT for a bad name or a converting checkpoint dtype,
  // ALREADY_EXISTS when taken, UNAVAILABLE while draining (a client's) or
  // once the owner thread stopped.
  absl::StatusOr<std::shared_ptr<Operation>> StartSnapshot(const SnapshotSpec& spec,
                                                           bool daemons_own = false);
  // Owner thread, after each completed step: on rank 0, every
  // snapshot_every_steps steps, queues the checkpoint "step-<global_step>"
  // unless it exists; a failure to queue is logged.
  void MaybeQueuePeriodicSnapshot(int64_t global_step);
  // A follower, owner thread, when rank 0 checkpoints a run whose optimizer
  // state is sharded: writes this rank's optimizer state (its shard) as its
  // rank file in `dir` (snapshot::WriteRankOptimizerFile).
  // FAILED_PRECONDITION without a model; the write's errors.
  absl::Status WriteOptimizerShard(const std::string& dir) override;

  // Session's ListSnapshots (empty without a root), DescribeSnapshot and
  // DeleteSnapshot (NOT_FOUND without a root; the store's errors).
  // DeleteSnapshot after the leader check: FAILED_PRECONDITION for one a
  // LoadModel in flight will read.
  absl::StatusOr<std::vector<snapshot::SnapshotManifest>> ListSnapshots() const;
  absl::StatusOr<snapshot::SnapshotManifest> DescribeSnapshot(
      const std::string& name) const;
  absl::Status DeleteSnapshot(const std::string& name);

  // Any thread: LoadModel operation `id` will read `directory` (as the
  // client named it), until ForgetLoad(id).
  void TrackLoad(const std::string& id, const std::string& directory);
  void ForgetLoad(const std::string& id);

  // Any thread: host bytes held by async snapshot copies not yet written.
  int64_t async_staging_bytes() const { return async_staging_bytes_.load(); }

  // Joins the async writers started so far; call once the owner thread has
  // stopped (no more are started then). Idempotent.
  void Join();

 private:
  // Queues a snapshot to run at the next step boundary, or when idle; a
  // client's is refused while draining (OperationRegistry::Admit).
  absl::StatusOr<std::shared_ptr<Operation>> QueueSnapshot(SnapshotSpec spec,
                                                           bool daemons_own);
  void RunSnapshot(const std::shared_ptr<Operation>& op, const SnapshotSpec& spec);
  // Rank 0 of a run with its optimizer state sharded, at the checkpoint's
  // step boundary: the other ranks' files in the side directory, and the
  // description, in `checkpoint`. The gather's errors (nothing left behind).
  absl::Status GatherOptimizerShards(const LlamaModel& model, const std::string& name,
                                     snapshot::CheckpointPayload* checkpoint);
  void FinishSnapshot(const std::shared_ptr<Operation>& op,
                      absl::StatusOr<snapshot::SnapshotManifest> manifest,
                      SnapshotMode mode);
  // `checkpoint`: null for a weights snapshot, else the payload with host
  // copies of the optimizer tensors.
  void RunAsyncWrite(const std::shared_ptr<Operation>& op, const SnapshotSpec& spec,
                     std::vector<std::pair<std::string, at::Tensor>> copies,
                     std::shared_ptr<snapshot::CheckpointPayload> checkpoint,
                     std::string config_json, int64_t staged_bytes);
  // keep_last: removes the oldest snapshots beyond it; a failure is logged.
  void ApplyRetention();

  const SessionOptions& options_;
  const bool follower_;
  OperationRegistry& operations_;
  ShardedState& sharded_;
  ModelHost& host_;
  OwnerThread& owner_;
  CounterBoard& counters_;
  ObserverList& observers_;
  std::atomic<int64_t> async_staging_bytes_{0};

  mutable absl::Mutex mu_;
  // Run at the next step boundary (or after the owner's next item when idle).
  std::deque<std::function<void()>> boundary_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> async_writers_ ABSL_GUARDED_BY(mu_);
  // The directories (as the client named them) of LoadModel operations
  // queued or running, by operation id: DeleteSnapshot refuses to delete
  // what one of them is about to read.
  std::map<std::string, std::string> loads_in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_SNAPSHOT_SCHEDULER_H_
