// Session: the operations calls of the door (get, list, wait bounds,
// cancel). The rules of what may be cancelled and how long a wait may block
// live here, once.

#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/session/rank_coordinator.h"
#include "core/session/session.h"

namespace memprofd {

absl::StatusOr<std::shared_ptr<Operation>> Session::GetOperation(
    const std::string& id) const {
  return operations_.Get(id);
}

std::vector<std::shared_ptr<Operation>> Session::ListOperations(
    std::optional<OperationKind> kind, bool active_only) const {
  return operations_.List(kind ? &*kind : nullptr, active_only);
}

absl::StatusOr<std::shared_ptr<Operation>> Session::GetTrainingOperation(
    const std::string& id) const {
  absl::StatusOr<std::shared_ptr<Operation>> op = operations_.Get(id);
  if (op.ok() && (*op)->kind() != OperationKind::kTrain) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operation ", id, " is a ", OperationKindName((*op)->kind()),
        " operation, not a training one; only training operations have step reports"));
  }
  return op;
}

absl::StatusOr<absl::Duration> Session::OperationWaitTimeout(
    std::optional<absl::Duration> timeout) {
  if (timeout && *timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a wait's timeout must be >= 0, got ",
                     absl::FormatDuration(*timeout), " (0 or unset waits the longest, ",
                     absl::FormatDuration(kMaxOperationWait), ")"));
  }
  if (!timeout || *timeout == absl::ZeroDuration()) return kMaxOperationWait;
  return std::min(*timeout, kMaxOperationWait);
}

absl::StatusOr<std::shared_ptr<Operation>> Session::CancelOperation(
    const std::string& id) {
  RETURN_IF_ERROR(ranks_->CheckLeader("CancelOperation"));
  absl::StatusOr<std::shared_ptr<Operation>> op = operations_.Get(id);
  if (!op.ok()) return op.status();
  if ((*op)->done()) {
    return absl::FailedPreconditionError(
        absl::StrCat("operation ", id, " is already done"));
  }
  (*op)->RequestCancel();
  return op;
}

int64_t Session::ActiveOperationCount() const { return operations_.ActiveCount(); }

}  // namespace memprofd
