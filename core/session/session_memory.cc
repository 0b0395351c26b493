// Session: the memory calls of the door, read through the process's
// recorder (runtime_.recorder()): stats, the history's recording and dumps,
// breakdowns by module, op or category, and step diffs. The default history
// size and what a dump needs live here, once.

#include <memory>
#include <optional>
#include <string>

#include "core/common/option_status.h"
#include "core/common/status_macros.h"
#include "core/memory/memory_viz.h"
#include "core/memory/recorder.h"
#include "core/session/model_host.h"
#include "core/session/rank_coordinator.h"
#include "core/session/runtime.h"
#include "core/session/session.h"

namespace memprofd {

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
  return memory::CaptureMemoryVizPickle(runtime_.recorder());
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
