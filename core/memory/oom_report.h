#ifndef MEMPROFD_CORE_MEMORY_OOM_REPORT_H_
#define MEMPROFD_CORE_MEMORY_OOM_REPORT_H_

// Out-of-memory reports: what the allocator saw when a request failed
// (captured on the failing thread, before the exception unwinds the step and
// frees what filled the device), and the report built from it — the failed
// request, the largest live allocations with their category, per-category
// totals, the device's allocated/reserved/free bytes and the last steps'
// peaks — as JSON. No LibTorch.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/common/attribution.h"
#include "core/common/json.h"
#include "core/common/phase.h"
#include "core/memory/category_bytes.h"
#include "core/memory/history.h"
#include "core/memory/memory_stats.h"

namespace memprofd {
namespace memory {

// What the allocator saw when a request failed.
struct OomCapture {
  int device = kCpuDevice;
  int64_t requested_bytes = 0;
  Phase phase = Phase::kIdle;  // CurrentPhase() / CurrentStep() of the failure
  int64_t step = 0;
  // The failing thread's attribution (its module and op asked for the bytes).
  Attribution request_origin;
  int64_t unix_time_ms = 0;
  // MemoryRecorder::HistoryPosition() at the failure: the history events
  // before it are those the live allocations come from (the step's unwinding
  // frees them right after).
  int64_t history_position = 0;
  // The device's allocations alive at the failure (address, size). Empty
  // when they could not be listed.
  std::vector<LiveBlock> live;
  // The allocator's bytes in use (the recorder's current bytes on the CPU;
  // the caching allocator's allocated bytes on CUDA).
  int64_t allocated_bytes = 0;
  // -1 where the device has no such figure. CUDA: the caching allocator's
  // reserved bytes, and cudaMemGetInfo's free / total (total is the allowed
  // maximum under a memory fraction). CPU: reserved = allocated (the CPU
  // allocator keeps no cache); free = MemAvailable, or what RLIMIT_AS or the
  // device memory limit (SetCpuMemoryLimit) leaves when less; total =
  // MemTotal, or RLIMIT_AS or that limit when smaller.
  int64_t reserved_bytes = -1;
  int64_t free_bytes = -1;
  int64_t total_bytes = -1;
};

// What a device can still hold, in bytes; -1 where unknown. CPU: free is
// MemAvailable, or what RLIMIT_AS or the device memory limit leaves when
// less; total is MemTotal, or RLIMIT_AS or that limit when smaller. CUDA
// (device >= 0): cudaMemGetInfo's free and total, plus what the caching
// allocator keeps reserved but unused (reusable without asking the driver),
// within the device memory limit (SetCudaMemoryLimit). Reads /proc: call it off gRPC's
// threads. Thread-safe.
struct DeviceRoom {
  int64_t free_bytes = -1;
  int64_t total_bytes = -1;
};
DeviceRoom QueryDeviceRoom(int device);

// Records a failed allocation of `requested_bytes` on `device`: the phase,
// step and time, the live allocations of that device and its byte counts.
// Called by the allocators' failure paths (the CPU allocator wrapper, the
// CUDA OOM observer) on the failing thread; `free_bytes` / `total_bytes` as
// the allocator reports them (-1: look them up, CPU). Keeps the newest
// capture only. Never throws (a capture that cannot be completed is kept
// without its live list). Thread-safe.
void NoteAllocationFailure(int device, int64_t requested_bytes, int64_t free_bytes = -1,
                           int64_t total_bytes = -1);

// The newest capture since the last call, taken out; nullopt when none.
// Thread-safe.
std::optional<OomCapture> TakeOomCapture();

// Attaches NoteAllocationFailure to the CUDA caching allocator's OOM
// observer (c10::cuda::CUDACachingAllocator::attachOutOfMemoryObserver;
// the allocator calls it without its lock held, before it throws
// OutOfMemoryError). Idempotent; a no-op in builds without CUDA code paths.
void InstallCudaOomObserver();

// One live allocation as a report lists it, from the attribution the
// allocator keeps per block (module, op, category, phase, step). A block
// without one (allocated before attribution was installed) gets its
// category by address (parameters, gradients, optimizer state; the rest is
// unknown) and its phase and step from the history ring
// when recording is on; its module and op stay empty.
struct LiveAllocation {
  uint64_t addr = 0;
  int64_t bytes = 0;
  std::string category;
  std::optional<Phase> phase;  // unknown without a history entry
  std::optional<int64_t> step;
  std::string module;
  std::string op;
};

// Peaks of one finished step.
struct StepPeaks {
  int64_t step = 0;
  std::vector<StepPeak> peaks;         // per device
  std::vector<PhasePeak> phase_peaks;  // per device and phase entered
  CategoryBytes categories_at_end;     // what the bytes held when it ended
};

// What BuildOomReport needs besides the capture.
struct OomReportInputs {
  std::string error;        // the failed step's status message
  int64_t global_step = 0;  // the step that failed
  // Category of each attributed allocation, by address (CategoryBytes::Named
  // names). Unlisted addresses are "unknown".
  absl::flat_hash_map<uint64_t, std::string> category_of;
  // Bytes outside the allocator, for the per-category totals.
  int64_t offloaded_host_bytes = 0;
  int64_t offloaded_disk_bytes = 0;
  int64_t snapshot_staging_bytes = 0;
  // The recorder's history (phases and steps of live allocations), when
  // recording; empty otherwise. history_dropped: the copy's dropped count
  // (entry i has index history_dropped + i; see HistoryPosition()).
  std::vector<HistoryEntry> history;
  int64_t history_dropped = 0;
  std::vector<StepPeaks> recent_steps;  // oldest first
};

struct OomReport {
  static constexpr int kLargest = 20;
  static constexpr int kRecentSteps = 10;

  std::string error;
  int64_t global_step = 0;
  int64_t failed_at_unix_ms = 0;
  // The failed request; module and op of the thread that asked (empty
  // outside any module scope).
  std::string device;
  int64_t requested_bytes = 0;
  std::optional<Phase> phase;
  std::string module;
  std::string op;
  // Capture's device figures (-1: unknown).
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = -1;
  int64_t free_bytes = -1;
  int64_t total_bytes = -1;
  int64_t live_allocations = 0;
  int64_t live_bytes = 0;
  std::vector<LiveAllocation> largest;  // at most kLargest, largest first
  CategoryBytes categories;             // over every live allocation
  std::vector<StepPeaks> recent_steps;  // at most kRecentSteps, oldest first
  bool captured = false;  // false: no allocator capture (the failure was seen
                          // only as an exception, e.g. std::bad_alloc)
};

// The report of `capture` (nullopt: the step failed with no allocator
// capture; the request is then unknown and nothing live is listed).
OomReport BuildOomReport(const std::optional<OomCapture>& capture,
                         const OomReportInputs& inputs);

// The report as JSON (the schema README.md documents: kind
// "memprofd.oom_report", version 1).
Json OomReportToJson(const OomReport& report);

// Peaks of one step as JSON (the peak file's body and the report's
// recent_steps entries).
Json StepPeaksToJson(const StepPeaks& peaks);

// Writes `contents` to `path` through `path`.tmp and a rename, so a reader
// (or a process killed meanwhile) sees the old file or the new one, never a
// part. The directory must exist. The errno as a status otherwise.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_OOM_REPORT_H_
