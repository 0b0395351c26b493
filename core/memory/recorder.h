#ifndef MEMPROFD_CORE_MEMORY_RECORDER_H_
#define MEMPROFD_CORE_MEMORY_RECORDER_H_

// Process-wide memory accounting: per-device current/peak bytes and event
// counts, per-step per-phase peaks, and the history ring. No LibTorch: the
// CPU allocator wrapper (cpu_allocator.h) feeds it, the server reads Stats().

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/common/attribution.h"
#include "core/common/phase.h"
#include "core/memory/history.h"
#include "core/memory/memory_stats.h"

namespace memprofd {
namespace memory {

// Live bytes of one (device, module, category) cell.
struct CellBytes {
  int device = kCpuDevice;
  ModuleId module = 0;
  Category category = Category::kUnknown;
  int64_t bytes = 0;
};

// The high-water mark of one (device, module, category) cell while a step was
// in `phase`. Cells are independent: their peaks need not coincide in time.
struct CellPhasePeak {
  int device = kCpuDevice;
  ModuleId module = 0;
  Category category = Category::kUnknown;
  Phase phase = Phase::kIdle;
  int64_t peak_bytes = 0;
};

// Bytes allocated by one op on one device.
struct OpBytes {
  int device = kCpuDevice;
  OpId op = 0;
  int64_t bytes = 0;
};

// What one finished step held, by attribution: cells' peaks per phase, cells'
// live bytes when it ended, bytes allocated per op. Only non-zero entries.
struct StepAttribution {
  int64_t step = 0;
  // Per (device, category, phase): the category's own high-water mark.
  std::vector<CellPhasePeak> category_phase_peaks;  // module = 0
  std::vector<CellPhasePeak> phase_peaks;
  std::vector<CellBytes> live_at_end;
  std::vector<OpBytes> op_bytes;
};

// Receives every allocation and free of the instrumented allocators and the
// phase/step boundaries (register it with SetPhaseListener(), or call
// InstallMemoryAccounting() from install.h which does both).
//
// Thread-safety: RecordAlloc/RecordFree run on any thread (OpenMP workers,
// autograd threads) and are lock-free unless history recording is on, when
// they take one short mutex-protected ring write. PhaseListener callbacks run
// on the owner thread. Everything else may be called from any thread; Stats()
// never blocks the owner thread for longer than a struct copy.
//
// Invariant: for each device, current bytes == sum of sizes allocated minus
// sum of sizes freed, over the events reported (so it returns to its baseline
// when the tensors are gone); the per-category bytes of a device sum to its
// current bytes, and each (module, category) cell is the sum of the sizes of
// the live blocks attributed to it.
class MemoryRecorder : public PhaseListener {
 public:
  static constexpr int kMaxCudaDevices = 16;

  // The process-wide instance the allocator wrapper reports to. Never
  // destroyed (tensors may be freed during static destruction). In core/,
  // only the installer and its hooks (install.h, cpu_allocator.h,
  // cuda_stats.h, an allocation failure's capture) and the Runtime
  // (core/session/runtime.h) name it; everything else is handed the Runtime's
  // recorder (a layering test checks it). Tests and benchmarks may use it.
  static MemoryRecorder& Global();

  // Separate instances are for tests; only Global() receives allocator events.
  MemoryRecorder() = default;
  ~MemoryRecorder();
  MemoryRecorder(const MemoryRecorder&) = delete;
  MemoryRecorder& operator=(const MemoryRecorder&) = delete;

  // One event of `size` bytes at `addr` on `device` (kCpuDevice or a CUDA
  // ordinal < kMaxCudaDevices; others are ignored). An alloc is attributed to
  // `origin` (CurrentAttribution() when the allocator took it); a free names
  // the block's attribution as the allocator kept it (with re-tags), and
  // happens in CurrentPhase()/CurrentStep(). Alloc and free of one block must
  // name the same module and category (after Retag), so that every
  // (module, category) cell returns to its baseline. The three-argument forms
  // attribute to nothing (module 0, category unknown).
  void RecordAlloc(int device, uint64_t addr, int64_t size, const Attribution& origin);
  void RecordFree(int device, uint64_t addr, int64_t size, const Attribution& block);
  void RecordAlloc(int device, uint64_t addr, int64_t size);
  void RecordFree(int device, uint64_t addr, int64_t size);
  // The attribution cells alone, for an allocator whose device totals and
  // history come from elsewhere (the CUDA caching allocator's, through
  // SampleCudaDevices and its own trace: cuda_stats.h): `size` bytes of
  // `device` attributed to `origin` become live, or stop being live. The
  // device's current/peak bytes, counts and history are not touched.
  void RecordAttributedAlloc(int device, int64_t size, const Attribution& origin);
  void RecordAttributedFree(int device, int64_t size, const Attribution& block);
  // A live block of `size` bytes attributed to `from` now holds `to_module`'s
  // `to_category` bytes (the allocator changed its record the same way).
  void Retag(int device, int64_t size, const Attribution& from, ModuleId to_module,
             Category to_category);

  // Live bytes per category on `device` now; they sum to CurrentBytes(device)
  // up to events in flight on other threads. Index = Category.
  std::array<int64_t, kNumCategories> CategoryBytesOf(int device) const;
  // Every non-zero (device, module, category) cell now.
  std::vector<CellBytes> LiveCells() const;
  // The last kStepRecords finished steps, oldest first.
  static constexpr int kStepRecords = 16;
  std::vector<StepAttribution> StepRecords() const;
  // Forgets the step records (a new model starts its own step numbering, so
  // an earlier model's step 3 must not be diffed against this one's).
  void ClearStepRecords();
  // Bytes allocated per op over every finished step (non-zero only).
  std::vector<OpBytes> OpBytesTotal() const;

  // PhaseListener. OnStepBegin clears this step's phase peaks; OnStepEnd
  // publishes them as "last step"; OnPhase seeds the entered phase's peak with
  // the bytes already held. With CUDA, each boundary also folds the caching
  // allocator's peaks in and resets them, so CUDA phase peaks are exact.
  void OnStepBegin(int64_t global_step) override;
  void OnStepEnd(int64_t global_step) override;
  void OnPhase(Phase phase) override;

  // Sets every device's peak to its current bytes.
  void ResetPeak();

  // History (see HistoryRing): INVALID_ARGUMENT for a bad max_entries. On
  // the global recorder, a start into an empty ring first appends a synthetic
  // alloc for every live CPU block with its attribution (parameters under
  // their names), so that nothing alive shows as a frameless ghost; a block
  // allocated or freed while that list is taken may be missed. With
  // CUDA code paths and track_cuda (the default), also the CUDA allocator's
  // own history, which initialises CUDA if nothing did.
  absl::Status StartRecording(int64_t max_entries);
  // Whether recording includes the CUDA allocator's history. The daemon
  // turns it off when it computes on the CPU, so that recording on a GPU host
  // does not create a CUDA context nobody uses. Takes effect at the next
  // StartRecording.
  void set_track_cuda(bool track) { track_cuda_.store(track, std::memory_order_relaxed); }
  bool track_cuda() const { return track_cuda_.load(std::memory_order_relaxed); }
  void StopRecording();
  void ClearHistory();
  HistorySnapshot History() const;
  // Events appended to the history since its last Clear() (dropped ones
  // included): the index the next event will get. Entry i of a later
  // History() copy has index copy.dropped + i.
  int64_t HistoryPosition() const;

  // Published statistics; safe from scrape threads.
  MemoryStatsView Stats() const;

  // Raw per-device reads (tests, benchmarks). Zero for an unknown device.
  int64_t CurrentBytes(int device) const;
  int64_t PeakBytes(int device) const;
  int64_t AllocCount(int device) const;
  int64_t FreeCount(int device) const;

 private:
  struct alignas(64) DeviceCounters {
    std::atomic<int64_t> current{0};
    std::atomic<int64_t> peak{0};
    std::atomic<int64_t> allocs{0};
    std::atomic<int64_t> frees{0};
    std::array<std::atomic<int64_t>, kNumPhases> phase_peak{};  // This step.
    // CUDA only, folded from the caching allocator at boundaries.
    std::atomic<int64_t> peak_reserved{0};
    std::atomic<int64_t> peak_active{0};
    std::atomic<bool> seen{false};
  };
  static constexpr int kCells = kMaxInternedNames * kNumCategories;
  // Attribution counters of one device, made on its first attributed event.
  struct Cells {
    std::array<std::atomic<int64_t>, kNumCategories> category_live{};
    std::array<std::atomic<int64_t>, kNumPhases * kNumCategories>
        category_peak{};  // This step.
    std::array<std::atomic<int64_t>, kCells>
        live{};  // module * kNumCategories + category
    std::array<std::atomic<int64_t>, kNumPhases * kCells> phase_peak{};  // This step.
    std::array<std::atomic<int64_t>, kMaxInternedNames> op_bytes{};      // This step.
    std::atomic<int> modules_seen{1};  // Highest module id seen + 1: bounds the scans.
    std::atomic<int> ops_seen{1};
  };
  struct Published {
    int64_t step = 0;
    std::vector<PhasePeak> phase_peaks;
    std::vector<StepPeak> step_peaks;
  };

  // The cells' part of an alloc or free (no-ops for a device out of range).
  void AddToCells(int device, int64_t size, const Attribution& origin);
  void RemoveFromCells(int device, int64_t size, const Attribution& block);
  // Appends one history entry stamped with the time and step (recording on).
  void Record(HistoryAction action, int device, uint64_t addr, int64_t size,
              const Attribution& a);
  DeviceCounters* Slot(int device);
  const DeviceCounters* Slot(int device) const;
  void FoldCudaPeaks(Phase ended_phase);
  Cells* CellsOf(int device);
  const Cells* CellsOf(int device) const;
  void AppendLiveBlocks();
  void SeedCellPeaks(Phase phase);
  StepAttribution CollectStepAttribution(int64_t global_step, uint32_t phases_seen) const;

  std::array<DeviceCounters, 1 + kMaxCudaDevices> devices_;
  std::array<std::atomic<Cells*>, 1 + kMaxCudaDevices>
      cells_{};  // Leaked with the recorder.
  std::atomic<bool> recording_{false};
  std::atomic<bool> track_cuda_{true};
  std::atomic<uint32_t> phases_seen_{0};                    // Bit per Phase, this step.
  std::atomic<int> phase_{static_cast<int>(Phase::kIdle)};  // Last OnPhase.
  HistoryRing history_;
  mutable absl::Mutex published_mu_;
  Published published_ ABSL_GUARDED_BY(published_mu_);
  std::deque<StepAttribution> step_records_ ABSL_GUARDED_BY(published_mu_);
  std::vector<OpBytes> op_totals_ ABSL_GUARDED_BY(published_mu_);
};

// "cpu" or "cuda:N".
std::string DeviceName(int device);

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_RECORDER_H_
