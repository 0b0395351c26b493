#ifndef MEMPROFD_CORE_SESSION_RANK_COORDINATOR_H_
#define MEMPROFD_CORE_SESSION_RANK_COORDINATOR_H_

// The session's part in a data-parallel run: this rank's seat among the
// ranks. It owns the process group and the store channels, hands rank 0's
// Train and LoadModel commands to the other ranks (the followers) and has
// them followed there, makes every rank agree at each step boundary, gathers
// the ranks' memory on rank 0, and keeps the state of a broken run.
//
// Protocol (the run's store, this attempt's prefix; every rank runs the same
// binary):
//   (all-gather)        every rank's sharding level, compared (JoinRun)
//   "start/resume"      rank 0's choice of checkpoint directory (JoinRun)
//   "cmd/<n>"           rank 0's n-th command, JSON: {"kind": "load"|"train"|
//                       "optimizer_shard"|"shutdown", ...}, published in the
//                       order its owner thread runs them; between runs, with
//                       the model kept sharded, also "parameters" and "units"
//                       (the streams below, outside a step boundary)
//   "mem/<rank>"        a follower's memory, about once a second
//   "boundary/<n>/<k>"  rank 0's k-th event of step boundary n, JSON: {"kind":
//                       "optimizer_shard", "dir", "id"} (write your optimizer
//                       shard into dir); and in a fully sharded run
//                       {"kind": "parameters"} (follow rank 0's parameter
//                       stream: ParameterSharding::FollowStream), {"kind":
//                       "units"} (follow the units of rank 0's evaluation:
//                       ParameterSharding::FollowUnitStream); then one
//                       {"kind": "done"} or {"kind": "failed", "code",
//                       "error"} ending it
//   "shard/<id>/<rank>" a follower's answer to gather `id`, JSON {"code",
//                       "error"}: code 0 when its optimizer file is written
//   "bye/<rank>"        a follower read "shutdown"
//
// A world of one rank (a single process) has a coordinator too, with no
// group and no threads: CheckLeader passes, the commands are empty,
// MemoryOfAllRanks reports this process alone, and the fatal state is never
// set.
//
// Threads:
// - Create's thread, before the session serves: JoinRun, then Start.
// - The session's owner thread: PublishCommand, SyncStepBoundary (which
//   runs the scheduler's BoundaryWork there), and the
//   collectives of group().
// - Its own threads, started by Start and joined by Join: on a follower the
//   follower thread ("mpd-follower": polls for rank 0's commands and hands
//   them to the session's callbacks, publishes this rank's memory); on rank
//   0 the rank-memory reader ("mpd-rank-memory": reads what the followers
//   published).
// - The thread that shuts the session down: Stop, then ReleaseFollowers once
//   the owner thread has joined, then Join.
// - Any thread: world, follower, CheckLeader, TrainCommand, LoadCommand,
//   SetFatalHandler, fatal_status, FailRun, MemoryOfAllRanks.
//
// Invariants:
// - Commands are numbered without gaps: rank 0 publishes "cmd/<n>" with n
//   counting up from 0, each follower follows them one by one in that order,
//   so every rank issues the same collectives in the same order.
// - Every rank calls SyncStepBoundary at every step boundary of a run, so
//   boundary n is the same on all ranks; while rank 0 runs boundary work the
//   followers wait at it.
// - The run breaks at most once: the first FailRun sets fatal_status and
//   calls the fatal handler once; later ones do nothing.
// - The callbacks are called without the coordinator's lock held, so they
//   may take the session's lock and call back into the coordinator.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/dist/sharding.h"
#include "core/memory/memory_stats.h"
#include "core/session/boundary_work.h"
#include "core/session/followed_commands.h"
#include "core/session/session_types.h"

namespace at {
class Tensor;
}
namespace memprofd {

class CounterBoard;
class OwnerThread;
class EvalUnits;
class ParameterSharding;
class ProcessGroup;
class StoreChannel;
namespace memory {
class MemoryRecorder;
}
namespace snapshot {
class TensorAccess;
}

class RankCoordinator : public ShardedState {
 public:
  // What the coordinator works with: the session's parts, made before it
  // and outliving it. `device` is the session's compute device ("cpu",
  // "cuda:N"); `collective_timeout` bounds the rendezvous and waiting for
  // rank 0's choice of checkpoint. `commands` runs what rank 0 tells a
  // follower to run; `owner` runs a follower's checkpoint answers;
  // `recorder` and `counters` give this rank's memory and steps to the
  // rank-memory thread.
  struct Parts {
    const WorldSpec& world;
    std::string device;
    absl::Duration collective_timeout;
    FollowedCommands& commands;
    OwnerThread& owner;
    const memory::MemoryRecorder& recorder;
    const CounterBoard& counters;
  };

  // Starts nothing.
  explicit RankCoordinator(Parts parts);
  // Stop, then Join.
  ~RankCoordinator() override;

  RankCoordinator(const RankCoordinator&) = delete;
  RankCoordinator& operator=(const RankCoordinator&) = delete;

  // Parameter drift is checked every this many steps of a data-parallel run
  // (and at its last step): one all-gather of a float64 checksum.
  static constexpr int64_t kDriftEverySteps = 10;

  const WorldSpec& world() const { return world_; }
  bool follower() const { return world_.distributed() && world_.rank != 0; }
  // The run's process group, for the owner thread's collectives; null on a
  // single process and before JoinRun.
  ProcessGroup* group() const { return group_.get(); }

  // Create's thread, before the start model loads, in a run of several ranks:
  // connects to the process group and the store, checks that every rank
  // was started with this rank's `sharding` (one all-gather, bounded by the
  // collective timeout), and agrees on the checkpoint to resume from.
  // Returns rank 0's `resume_directory()` on every rank (empty: none).
  // Errors: ProcessGroup::Connect's; the all-gather's; on every rank, when a
  // rank's level differs from rank 0's, FAILED_PRECONDITION about the
  // sharding option naming the first such rank and both levels;
  // resume_directory's on rank 0; and on a follower rank 0's not choosing
  // within the collective timeout (the code of the wait, naming it).
  absl::StatusOr<std::string> JoinRun(
      Sharding sharding,
      const std::function<absl::StatusOr<std::string>()>& resume_directory);
  // After JoinRun and the ranks' alignment: starts the follower's thread (a
  // follower) or the rank-memory reader (rank 0). `work` (the snapshot
  // scheduler, made after the coordinator) is what step boundaries run and
  // what writes a follower's optimizer state; it outlives the coordinator's
  // threads (Stop and Join come first).
  void Start(BoundaryWork* work);
  // Makes the threads stop at their next poll; idempotent.
  void Stop();
  // Rank 0, once its owner thread has stopped (the runs stopped at a step
  // boundary on every rank): tells the followers to stop, and waits a little
  // for them to read it. Does nothing on a follower, on a single process, or
  // after the run broke (the followers fail on their own then).
  void ReleaseFollowers();
  // Joins the threads Start started; call after Stop.
  void Join();

  // OK on rank 0 and on a single process; FAILED_PRECONDITION naming rank 0
  // on a follower, for `what` ("Train").
  absl::Status CheckLeader(absl::string_view what) const;

  // The commands rank 0 publishes for a Train and a LoadModel; empty on a
  // single process.
  std::string TrainCommand(const TrainOptions& train,
                           const offload::OffloadOverrides& offload, bool resume) const;
  std::string LoadCommand(const LoadModelSpec& spec) const;
  // Rank 0, owner thread: hands a command (TrainCommand, LoadCommand) to the
  // followers, in the order the owner runs them. The store's error when it
  // cannot be written (the caller breaks the run with it).
  absl::Status PublishCommand(const std::string& command);

  // Before each training step, every rank (owner thread): one all-reduce
  // tells all whether to stop (`cancel_requested` on any rank) and whether
  // rank 0 has boundary work (snapshots, evaluations), which rank 0 then
  // runs and the followers wait for. True: stop. The collective's error, or
  // the wait's, naming what was waited for. `sharded`: the run's parameters
  // when they are sharded (fully sharded data parallel; null otherwise),
  // for the boundary work that reads them (StreamParameters,
  // EvaluationUnits) and the followers' part in it.
  absl::StatusOr<bool> SyncStepBoundary(bool cancel_requested,
                                        ParameterSharding* sharded = nullptr);

  // Every rank, owner thread: the parameters of the last fully sharded run,
  // which stay sharded after it (null: the model is whole). Rank 0's work
  // outside a run reads them through the streams below; the followers
  // follow those as commands.
  void KeepShardedModel(ParameterSharding* sharded) { idle_sharded_ = sharded; }

  // Rank 0, owner thread, in boundary work where the parameters are
  // sharded (at a step boundary of a fully sharded run, or between runs
  // after one, KeepShardedModel): has every rank stream the parameters with
  // this one (ParameterSharding's stream), for a writer reading `weights`
  // (the model's named parameters) through the returned access, one
  // gathered at a time. Destroying the access ends the stream on every
  // rank, whatever the writer did. Null (and nothing happens) elsewhere: the
  // model whole, or a single process. The store's error when the followers
  // cannot be told. A failed collective of the stream fails the boundary
  // (SyncStepBoundary returns it on every rank), or between runs breaks the
  // run (FailRun).
  absl::StatusOr<std::unique_ptr<snapshot::TensorAccess>> StreamParameters(
      const std::vector<std::pair<std::string, at::Tensor>>& weights) override;
  // Rank 0, owner thread, in boundary work (an evaluation) where the
  // parameters are sharded (as StreamParameters): has every rank gather the
  // units of the evaluation's forward with this one, one unit at a time,
  // through the returned EvalUnits (ParameterSharding's unit stream);
  // destroying it ends the stream on every rank and frees what is gathered.
  // Null (and nothing happens) elsewhere. The store's error when the
  // followers cannot be told; a failed collective fails the boundary, or
  // between runs the run.
  absl::StatusOr<std::unique_ptr<EvalUnits>> EvaluationUnits();

  // Rank 0, owner thread, while it writes a checkpoint of a run whose
  // optimizer state is sharded: has every follower write its optimizer
  // state into `dir` (at a step boundary, where they wait, through the
  // boundary's events; when idle, as a command) and waits until each has
  // answered. OK once every follower's file is complete in `dir`; otherwise
  // the first failure, naming the rank: its own error, or DEADLINE_EXCEEDED
  // when it did not answer within the collective timeout (it died or hangs).
  // At a step boundary a failure also fails the boundary: SyncStepBoundary
  // returns it on every rank, which breaks the run. OK at once on a single
  // process.
  absl::Status GatherOptimizerShards(const std::string& dir) override;

  // Called once, from the thread that saw it, when the run is broken (see
  // Session::SetFatalHandler); at once when it already is.
  void SetFatalHandler(std::function<void(const absl::Status&)> handler);
  // Set once the run is broken; OK when rank 0 ended it (a follower told to
  // shut down).
  std::optional<absl::Status> fatal_status() const;
  // The run is broken (or, OK, ended by rank 0): records it and calls the
  // fatal handler, the first time only.
  void FailRun(const absl::Status& status);

  // Every rank's memory (this rank's now, the followers' as the reader
  // thread last read them), with the spread across ranks. On a single
  // process, that process alone. FAILED_PRECONDITION on a follower.
  absl::StatusOr<MemoryAcrossRanks> MemoryOfAllRanks() const;

 private:
  // JoinRun's check that every rank uses `sharding`: one all-gather.
  absl::Status AgreeOnSharding(Sharding sharding);
  void FollowerLoop();
  void RankMemoryReaderLoop();
  // Parses one of rank 0's commands and hands it to the callbacks.
  // CANCELLED for "shutdown".
  absl::Status FollowCommand(const std::string& text);
  // This rank's memory, as MemoryOfAllRanks reports it.
  RankMemory OwnRankMemory() const;
  // A follower, owner thread: writes its optimizer shard for gather `id`
  // and answers rank 0. The store's error when the answer cannot be set.
  absl::Status AnswerOptimizerShard(const std::string& dir, int64_t id);
  // A follower, owner thread, at step boundary `boundary` where rank 0 has
  // boundary work: follows its events until it is done. The wait's error,
  // or rank 0's failure of the boundary.
  absl::Status FollowBoundary(int64_t boundary);
  // Rank 0, owner thread, during boundary work: publishes the next event of
  // the current boundary; the store's error (which fails the boundary).
  absl::Status PublishBoundaryEvent(const std::string& event);
  // Rank 0: records the boundary's first failure.
  void FailBoundary(const absl::Status& status);
  // Rank 0, owner thread: the sharded parameters the boundary work running
  // now reads (a step boundary's of a fully sharded run, or between runs
  // the kept ones); null where the model is whole.
  ParameterSharding* ShardedNow() const {
    return current_boundary_ >= 0 ? sharded_ : idle_sharded_;
  }
  // Rank 0, owner thread: tells the followers to follow a stream of the
  // sharded parameters (`kind`: "parameters" or "units"), as a boundary
  // event at a step boundary, as a command between runs; and a failure of
  // that stream, which fails the boundary or, between runs, the run.
  absl::Status PublishStream(const std::string& kind);
  void FailStream(const absl::Status& status);
  // A follower, owner thread: follows the stream `kind` of `sharded`.
  static absl::Status FollowStream(ParameterSharding* sharded, const std::string& kind);
  friend class BoundaryParameterStream;
  friend class BoundaryEvaluation;

  const WorldSpec world_;
  const std::string device_;
  const absl::Duration collective_timeout_;
  FollowedCommands& followed_;
  OwnerThread& owner_;
  const memory::MemoryRecorder& recorder_;
  const CounterBoard& counters_;
  // Start's: the snapshot scheduler's boundary work (null before Start).
  BoundaryWork* boundary_work_ = nullptr;

  // The group: its collectives and store calls are the owner thread's (and
  // Create's, before the owner runs anything; and Shutdown's, after it
  // stopped). The command channel: the follower's thread. The memory
  // channel: the rank-memory reader thread (rank 0). Set in JoinRun.
  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<StoreChannel> command_channel_;
  std::unique_ptr<StoreChannel> memory_channel_;
  // Commands published (rank 0, owner thread) or followed (followers'
  // thread), and step boundaries synchronised (owner thread).
  int64_t commands_ = 0;
  int64_t boundaries_ = 0;
  // Rank 0, owner thread: the boundary whose work runs now (-1: none), the
  // events it published, its first failure, and gathers started.
  int64_t current_boundary_ = -1;
  int64_t boundary_events_ = 0;
  absl::Status boundary_failure_;
  // Every rank, owner thread: the run's sharded parameters during a step
  // boundary (SyncStepBoundary's `sharded`); null otherwise.
  ParameterSharding* sharded_ = nullptr;
  // Every rank, owner thread: KeepShardedModel's.
  ParameterSharding* idle_sharded_ = nullptr;
  int64_t gathers_ = 0;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(const absl::Status&)> fatal_handler_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> fatal_ ABSL_GUARDED_BY(mu_);
  // What each follower (index rank - 1) last published, as the reader thread
  // last read it: the text, nullopt before it has published, or why it
  // could not be read.
  std::vector<absl::StatusOr<std::optional<std::string>>> follower_memory_
      ABSL_GUARDED_BY(mu_);

  std::thread follower_;
  std::thread rank_memory_reader_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_RANK_COORDINATOR_H_
