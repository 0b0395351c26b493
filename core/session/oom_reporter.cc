#include "core/session/oom_reporter.h"

#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/json.h"
#include "core/common/log.h"
#include "core/common/option_status.h"
#include "core/memory/history.h"
#include "core/memory/recorder.h"
#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/session/runtime.h"
#include "core/train/trainer.h"

namespace memprofd {
namespace {

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Adds the data address of `t`'s storage on `device` under `category`
// (first category wins, as in ComputeCategories).
void AddAddress(const at::Tensor& t, int device, const char* category,
                absl::flat_hash_map<uint64_t, std::string>* out) {
  if (!t.defined() || !t.has_storage() || t.storage().data() == nullptr) return;
  const c10::Device d = t.device();
  const int index = d.is_cpu() ? memory::kCpuDevice : d.index();
  if (index != device) return;
  out->emplace(reinterpret_cast<uint64_t>(t.storage().data()), category);
}

}  // namespace

OomReporter::OomReporter(memory::MemoryRecorder& recorder, const std::string& device,
                         std::string report_dir, std::string peak_file)
    : recorder_(recorder),
      recorder_device_(RecorderDeviceOf(device)),
      report_dir_(std::move(report_dir)),
      peak_file_(std::move(peak_file)) {}

absl::StatusOr<OomReportRecord> OomReporter::LastReport() const {
  absl::MutexLock lock(&mu_);
  if (!last_) {
    return absl::NotFoundError(
        "no training step has run out of memory since memprofd started");
  }
  return *last_;
}

int64_t OomReporter::reports_total() const {
  absl::MutexLock lock(&mu_);
  return reports_total_;
}

void OomReporter::RecordOutOfMemory(const absl::Status& status, int64_t global_step,
                                    const Holders& holders) {
  std::optional<memory::OomCapture> capture = memory::TakeOomCapture();
  // A capture from another step (a failure LibTorch recovered from) is not
  // this one's.
  if (capture && capture->step != global_step) capture.reset();
  memory::OomReportInputs in;
  in.error = std::string(status.message());
  in.global_step = global_step;
  const int index = capture ? capture->device : recorder_device_;
  // The gradients are still there (the trainer clears them after this).
  if (holders.model != nullptr) {
    for (const auto& [name, p] : holders.model->NamedParameters()) {
      AddAddress(p, index, p.requires_grad() ? "parameters" : "frozen_parameters",
                 &in.category_of);
    }
    for (const at::Tensor& p : holders.model->Parameters()) {
      AddAddress(p.grad(), index, "gradients", &in.category_of);
    }
  }
  if (holders.trainer != nullptr) {
    for (const at::Tensor& t : holders.trainer->OptimizerState()) {
      AddAddress(t, index, "optimizer_state", &in.category_of);
    }
  }
  if (holders.offloader != nullptr) {
    in.offloaded_host_bytes = holders.offloader->host_bytes_held();
    in.offloaded_disk_bytes = holders.offloader->disk_bytes_held();
  }
  in.snapshot_staging_bytes = holders.snapshot_staging_bytes;
  memory::HistorySnapshot history = recorder_.History();
  in.history = std::move(history.entries);
  in.history_dropped = history.dropped;
  in.recent_steps.assign(recent_peaks_.begin(), recent_peaks_.end());

  OomReportRecord record;
  record.report = memory::BuildOomReport(capture, in);
  record.written_at_unix_ms = NowUnixMs();
  Json json = memory::OomReportToJson(record.report);
  json["written_at_unix_ms"] = record.written_at_unix_ms;
  record.json = DumpJson(json, 2);
  if (!report_dir_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(report_dir_, ec);
    const std::string path = absl::StrCat(report_dir_, "/oom-step", global_step, "-",
                                          record.report.failed_at_unix_ms, ".json");
    absl::Status written =
        ec ? OptionError(absl::StatusCode::kFailedPrecondition, "report_dir",
                         absl::StrCat("cannot create report_dir='", report_dir_,
                                      "': ", ec.message()))
           : memory::WriteFileAtomically(path, record.json + "\n");
    if (written.ok()) {
      record.path = path;
      LogWarning(
          absl::StrCat("step ", global_step, " ran out of memory; report: ", path));
    } else {
      record.write_error = std::string(written.message());
      LogWarning(absl::StrCat(
          "step ", global_step,
          " ran out of memory; the report could not be written: ", written.message()));
    }
  }
  absl::MutexLock lock(&mu_);
  last_ = std::move(record);
  reports_total_ += 1;
}

void OomReporter::RecordStepPeaks(const SessionStepReport& report,
                                  const memory::CategoryBytes& categories_at_end) {
  const memory::MemoryStatsView stats = recorder_.Stats();
  memory::StepPeaks peaks;
  peaks.step = report.step.global_step;
  peaks.peaks = stats.last_step_peaks;
  peaks.phase_peaks = stats.last_step_phase_peaks;
  peaks.categories_at_end = categories_at_end;
  recent_peaks_.push_back(peaks);
  while (recent_peaks_.size() > static_cast<size_t>(memory::OomReport::kRecentSteps)) {
    recent_peaks_.pop_front();
  }
  if (peak_file_.empty()) return;
  Json json = memory::StepPeaksToJson(peaks);
  json["kind"] = "memprofd.peak_file";
  json["version"] = 1;
  json["written_at_unix_ms"] = NowUnixMs();
  // Each category's own high-water mark in each phase of the step on the
  // compute device (attribution at allocation time): {phase: {category: bytes}}.
  Json category_peaks = Json::object();
  for (const memory::StepAttribution& record : recorder_.StepRecords()) {
    if (record.step != report.step.global_step) continue;
    for (const memory::CellPhasePeak& p : record.category_phase_peaks) {
      if (p.device != recorder_device_) continue;
      category_peaks[std::string(PhaseName(p.phase))]
                    [std::string(CategoryName(p.category))] = p.peak_bytes;
    }
  }
  json["category_phase_peak_bytes"] = std::move(category_peaks);
  Json offload = Json::object();
  offload["bytes_out"] = report.offload.bytes_out;
  offload["effective_bytes"] = report.offload.effective_bytes;
  offload["ineffective_bytes"] = report.offload.ineffective_bytes;
  offload["peak_resident_saved_bytes"] = report.offload.peak_resident_saved_bytes;
  json["offload"] = std::move(offload);
  // No fsync: the page cache outlives the process (SIGKILL, the OOM killer);
  // only a host crash could lose the newest step, and a sync per step would
  // cost more than the step on small models.
  if (absl::Status s = memory::WriteFileAtomically(peak_file_, DumpJson(json, 2));
      !s.ok()) {
    LogWarning(absl::StrCat("peak_file: ", s.message()));
  }
}

}  // namespace memprofd
