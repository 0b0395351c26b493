// Session: the operations and memory calls of the one door into core
// (recording, dumps, breakdowns and step diffs). The rules the server used to
// hold (what may be cancelled, the default history size, what a dump needs)
// live here.

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/option_status.h"
#include "core/common/status_macros.h"
#include "core/memory/memory_viz.h"
#include "core/memory/recorder.h"
#include "core/session/model_host.h"
#include "core/session/rank_coordinator.h"
#include "core/session/runtime.h"
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

memory::MemoryStatsView Session::MemoryStats() const {
  return runtime_.recorder().Stats();
}

void Session::ResetPeakMemory() { runtime_.recorder().ResetPeak(); }

absl::Status Session::StartMemoryRecording(std::optional<int64_t> max_entries) {
  return runtime_.recorder().StartRecording(max_entries.value_or(kDefaultHistoryEntries));
}

void Session::StopMemoryRecording(bool clear) {
  memory::MemoryRecorder& recorder = runtime_.recorder();
  recorder.StopRecording();
  if (clear) recorder.ClearHistory();
}

absl::StatusOr<std::string> Session::DumpMemoryHistory() const {
  const memory::MemoryStatsView stats = runtime_.recorder().Stats();
  if (!stats.recording && stats.history_entries == 0) {
    return absl::FailedPreconditionError(
        "nothing was recorded; StartMemoryRecording first");
  }
  return memory::CaptureMemoryVizPickle();
}

absl::StatusOr<memory::MemoryBreakdown> Session::MemoryBreakdown(
    const memory::BreakdownRequest& request) const {
  ASSIGN_OR_RETURN(const memory::BreakdownQuery query,
                   memory::ParseBreakdownQuery(request, host_->recorder_device()));
  memory::MemoryBreakdown out = memory::ComputeBreakdown(runtime_.recorder(), query);
  const memory::CategoryBytes published = host_->PublishedCategories();
  out.offloaded_host_bytes = published.offloaded_host;
  out.offloaded_disk_bytes = published.offloaded_disk;
  return out;
}

absl::StatusOr<memory::MemoryDiff> Session::DiffMemory(int64_t step_a, int64_t step_b,
                                                       std::optional<int64_t> top) const {
  return memory::ComputeDiff(runtime_.recorder(), step_a, step_b, top,
                             host_->recorder_device());
}

memory::ModuleKindBytes Session::MemoryByModuleKind() const {
  return memory::LiveBytesByModuleKind(runtime_.recorder(), host_->recorder_device());
}

}  // namespace memprofd
