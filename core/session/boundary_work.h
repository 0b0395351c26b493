#ifndef MEMPROFD_CORE_SESSION_BOUNDARY_WORK_H_
#define MEMPROFD_CORE_SESSION_BOUNDARY_WORK_H_

// The two narrow interfaces between the rank coordinator and the snapshot
// scheduler, so that their dependency runs one way when they are made: the
// scheduler is made with the coordinator's ShardedState; the coordinator
// gets the scheduler's BoundaryWork when it starts (RankCoordinator::Start),
// once both exist.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace at {
class Tensor;
}
namespace memprofd {
namespace snapshot {
class TensorAccess;
}

// What waits for a step boundary (snapshots, evaluations) and what a
// follower writes of a checkpoint: SnapshotScheduler's.
class BoundaryWork {
 public:
  virtual ~BoundaryWork() = default;
  // Owner thread: whether work waits for the next step boundary, and running
  // it there.
  virtual bool HasBoundaryWork() const = 0;
  virtual void RunBoundaryWork() = 0;
  // A follower, owner thread: writes this rank's optimizer state into `dir`.
  virtual absl::Status WriteOptimizerShard(const std::string& dir) = 0;
};

// The training state that other ranks hold, as a snapshot of rank 0 reads
// it: RankCoordinator's (a single process holds it all, and these do
// nothing).
class ShardedState {
 public:
  virtual ~ShardedState() = default;
  // Rank 0, owner thread, writing a checkpoint: every follower's optimizer
  // state written into `dir`.
  virtual absl::Status GatherOptimizerShards(const std::string& dir) = 0;
  // Rank 0, owner thread, at a step boundary of a fully sharded run: the
  // access a snapshot reads `weights` through, each gathered from its owner
  // as it is written; null where every weight is resident.
  virtual absl::StatusOr<std::unique_ptr<snapshot::TensorAccess>> StreamParameters(
      const std::vector<std::pair<std::string, at::Tensor>>& weights) = 0;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_BOUNDARY_WORK_H_
