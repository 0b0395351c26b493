#ifndef MEMPROFD_CORE_SESSION_FOLLOWED_COMMANDS_H_
#define MEMPROFD_CORE_SESSION_FOLLOWED_COMMANDS_H_

// The rank coordinator's one way into the session, so that it is made with
// it rather than wired to it by callbacks.

#include "absl/status/status.h"
#include "core/session/session_types.h"

namespace memprofd {

// What rank 0 commands a follower to run, entering the session as a
// client's request does: the session's follower doors. The follower's
// thread calls them, in the order rank 0 sent the commands; each queues its
// work on the owner thread. An error breaks the run (FailRun with it),
// except CANCELLED: the session is shutting down, and the follower's thread
// just stops.
class FollowedCommands {
 public:
  virtual ~FollowedCommands() = default;
  virtual absl::Status FollowLoad(const LoadModelSpec& spec) = 0;
  virtual absl::Status FollowTrain(const TrainOptions& train,
                                   const offload::OffloadOverrides& offload,
                                   bool resume) = 0;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_FOLLOWED_COMMANDS_H_
