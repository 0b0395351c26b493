#ifndef MEMPROFD_CORE_SESSION_OOM_REPORTER_H_
#define MEMPROFD_CORE_SESSION_OOM_REPORTER_H_

// The session's out-of-memory reports and the per-step peak record behind
// them. After a training step ran out of memory it builds the report from
// the allocator's capture (memory/oom_report.h), attributing the blocks it
// can to the parameters, gradients and optimizer state the caller holds,
// writes it under report_dir and keeps it as the last report. After each
// completed step it keeps the step's peaks (the last
// OomReport::kRecentSteps, which the next report carries) and writes the
// peak file.
//
// Threads:
// - The session's owner thread (the training run's step listener):
//   RecordOutOfMemory, RecordStepPeaks.
// - Any thread: LastReport, reports_total.
//
// Invariants:
// - The recent peaks are the last kRecentSteps completed steps at most,
//   oldest first.
// - reports_total counts the reports built since start and LastReport is
//   the newest of them; both change together.
// - Files never fail a step: a report that cannot be written is still kept,
//   with its write_error; a peak file that cannot be written is logged.

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/memory/category_bytes.h"
#include "core/memory/oom_report.h"
#include "core/session/session_types.h"

namespace memprofd {

class LlamaModel;
class Trainer;
namespace memory {
class MemoryRecorder;
}
namespace offload {
class Offloader;
}

class OomReporter {
 public:
  // What holds memory when a step fails, beside the allocator's blocks the
  // capture lists. Each pointer may be null (nothing of that kind is loaded);
  // they are read during RecordOutOfMemory only.
  struct Holders {
    // Its parameters, and their gradients (not yet cleared when a step
    // fails).
    const LlamaModel* model = nullptr;
    // Its optimizer state.
    const Trainer* trainer = nullptr;
    // The bytes it holds off the device (host and disk).
    const offload::Offloader* offloader = nullptr;
    // Host bytes held by snapshot copies not yet written.
    int64_t snapshot_staging_bytes = 0;
  };

  // `recorder` (which outlives this) is read for the history and the
  // step's peaks; `device` is the session's compute device ("cpu",
  // "cuda:N"). `report_dir` (SessionOptions::report_dir) and `peak_file`
  // (SessionOptions::peak_file) may be empty: no files of that kind.
  OomReporter(memory::MemoryRecorder& recorder, const std::string& device,
              std::string report_dir, std::string peak_file);

  OomReporter(const OomReporter&) = delete;
  OomReporter& operator=(const OomReporter&) = delete;

  // After step `global_step` failed with `status` (RESOURCE_EXHAUSTED),
  // before its gradients are cleared: builds its report from the allocator's
  // capture (a capture of another step is not used), writes it under
  // report_dir (logging where, or why not) and publishes it. LibTorch may
  // throw when memory is still short; the caller catches.
  void RecordOutOfMemory(const absl::Status& status, int64_t global_step,
                         const Holders& holders);
  // After each completed step: keeps its peaks, with the categories at its
  // end, and writes the peak file (a failure is logged).
  void RecordStepPeaks(const SessionStepReport& report,
                       const memory::CategoryBytes& categories_at_end);

  // The newest report (a copy). NOT_FOUND when no step ran out of memory
  // since start.
  absl::StatusOr<OomReportRecord> LastReport() const;
  // The number of reports built since start.
  int64_t reports_total() const;

 private:
  memory::MemoryRecorder& recorder_;
  // The recorder's number for the compute device.
  const int recorder_device_;
  const std::string report_dir_;
  const std::string peak_file_;

  // The owner thread's: the last steps' peaks, oldest first (at most
  // OomReport::kRecentSteps).
  std::deque<memory::StepPeaks> recent_peaks_;

  mutable absl::Mutex mu_;
  std::optional<OomReportRecord> last_ ABSL_GUARDED_BY(mu_);
  int64_t reports_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_OOM_REPORTER_H_
