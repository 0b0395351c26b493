// Session: the snapshot calls of the one door. The leader rule is the
// session's; the rest is the snapshot scheduler's (snapshot_scheduler.h).

#include "core/common/status_macros.h"
#include "core/session/rank_coordinator.h"
#include "core/session/session.h"
#include "core/session/snapshot_scheduler.h"

namespace memprofd {

absl::StatusOr<std::shared_ptr<Operation>> Session::StartSnapshot(
    const SnapshotSpec& spec) {
  RETURN_IF_ERROR(ranks_->CheckLeader("Snapshot"));
  return snapshots_->StartSnapshot(spec);
}

absl::StatusOr<std::vector<snapshot::SnapshotManifest>> Session::ListSnapshots() const {
  return snapshots_->ListSnapshots();
}

absl::StatusOr<snapshot::SnapshotManifest> Session::DescribeSnapshot(
    const std::string& name) const {
  return snapshots_->DescribeSnapshot(name);
}

absl::Status Session::DeleteSnapshot(const std::string& name) {
  RETURN_IF_ERROR(ranks_->CheckLeader("DeleteSnapshot"));
  return snapshots_->DeleteSnapshot(name);
}

}  // namespace memprofd
