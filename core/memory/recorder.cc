#include "core/memory/recorder.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/memory/cpu_allocator.h"
#ifdef MEMPROFD_WITH_CUDA
#include "core/memory/cuda_stats.h"
#endif

namespace memprofd {
namespace memory {
namespace {

// Raises `target` to at least `value`. The common case (no new maximum) is a
// single relaxed load.
inline void UpdateMax(std::atomic<int64_t>& target, int64_t value) {
  int64_t seen = target.load(std::memory_order_relaxed);
  while (value > seen &&
         !target.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// Unix epoch microseconds, read once per recorded event. On Linux the coarse
// real-time clock (one jiffy, 1-4 ms, of resolution): 4.5 ns per read here
// against 31 ns for system_clock. Events keep their exact order in the ring;
// the viewer's x axis is the event index, not the time.
inline int64_t NowUs() {
#ifdef CLOCK_REALTIME_COARSE
  timespec ts;
  clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
#else
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
#endif
}

inline int PhaseIndex(Phase phase) {
  const int i = static_cast<int>(phase);
  return (i >= 0 && i < kNumPhases) ? i : 0;
}

}  // namespace

std::string DeviceName(int device) {
  return device == kCpuDevice ? std::string("cpu") : absl::StrCat("cuda:", device);
}

MemoryRecorder& MemoryRecorder::Global() {
  static MemoryRecorder* const recorder = new MemoryRecorder();
  return *recorder;
}

MemoryRecorder::DeviceCounters* MemoryRecorder::Slot(int device) {
  if (device < kCpuDevice || device >= kMaxCudaDevices) return nullptr;
  return &devices_[static_cast<size_t>(device + 1)];
}

const MemoryRecorder::DeviceCounters* MemoryRecorder::Slot(int device) const {
  if (device < kCpuDevice || device >= kMaxCudaDevices) return nullptr;
  return &devices_[static_cast<size_t>(device + 1)];
}

MemoryRecorder::~MemoryRecorder() {
  for (auto& c : cells_) delete c.load(std::memory_order_relaxed);
}

MemoryRecorder::Cells* MemoryRecorder::CellsOf(int device) {
  if (device < kCpuDevice || device >= kMaxCudaDevices) return nullptr;
  std::atomic<Cells*>& slot = cells_[static_cast<size_t>(device + 1)];
  Cells* cells = slot.load(std::memory_order_acquire);
  if (cells != nullptr) return cells;
  auto* made = new Cells();
  if (slot.compare_exchange_strong(cells, made, std::memory_order_acq_rel)) return made;
  delete made;  // Another thread made it first.
  return cells;
}

const MemoryRecorder::Cells* MemoryRecorder::CellsOf(int device) const {
  if (device < kCpuDevice || device >= kMaxCudaDevices) return nullptr;
  return cells_[static_cast<size_t>(device + 1)].load(std::memory_order_acquire);
}

namespace {

inline size_t CellIndex(ModuleId module, Category category) {
  return static_cast<size_t>(module) * kNumCategories + static_cast<size_t>(category);
}

inline void RaiseTo(std::atomic<int>& seen, int value) {
  if (seen.load(std::memory_order_relaxed) < value) {
    int s = seen.load(std::memory_order_relaxed);
    while (s < value &&
           !seen.compare_exchange_weak(s, value, std::memory_order_relaxed)) {
    }
  }
}

}  // namespace

void MemoryRecorder::RecordAlloc(int device, uint64_t addr, int64_t size) {
  Attribution a;
  a.step = CurrentStep();
  a.phase = CurrentPhase();
  RecordAlloc(device, addr, size, a);
}

void MemoryRecorder::RecordFree(int device, uint64_t addr, int64_t size) {
  RecordFree(device, addr, size, Attribution());
}

void MemoryRecorder::RecordAlloc(int device, uint64_t addr, int64_t size,
                                 const Attribution& origin) {
  DeviceCounters* c = Slot(device);
  if (c == nullptr) return;
  const Phase phase = origin.phase;
  const int64_t now = c->current.fetch_add(size, std::memory_order_relaxed) + size;
  c->allocs.fetch_add(1, std::memory_order_relaxed);
  UpdateMax(c->peak, now);
  UpdateMax(c->phase_peak[static_cast<size_t>(PhaseIndex(phase))], now);
  AddToCells(device, size, origin);
  if (recording_.load(std::memory_order_relaxed)) {
    Record(HistoryAction::kAlloc, device, addr, size, origin);
  }
}

void MemoryRecorder::RecordAttributedAlloc(int device, int64_t size,
                                           const Attribution& origin) {
  AddToCells(device, size, origin);
}

void MemoryRecorder::RecordAttributedFree(int device, int64_t size,
                                          const Attribution& block) {
  RemoveFromCells(device, size, block);
}

void MemoryRecorder::AddToCells(int device, int64_t size, const Attribution& origin) {
  Cells* cells = CellsOf(device);
  if (cells == nullptr) return;
  const Phase phase = origin.phase;
  const size_t cell = CellIndex(origin.module, origin.category);
  const int64_t held =
      cells->live[cell].fetch_add(size, std::memory_order_relaxed) + size;
  UpdateMax(cells->phase_peak[static_cast<size_t>(PhaseIndex(phase)) * kCells + cell],
            held);
  const int64_t category_held =
      cells->category_live[static_cast<size_t>(origin.category)].fetch_add(
          size, std::memory_order_relaxed) +
      size;
  UpdateMax(cells->category_peak[static_cast<size_t>(PhaseIndex(phase)) * kNumCategories +
                                 static_cast<size_t>(origin.category)],
            category_held);
  RaiseTo(cells->modules_seen, origin.module + 1);
  if (origin.op != 0) {
    cells->op_bytes[origin.op].fetch_add(size, std::memory_order_relaxed);
    RaiseTo(cells->ops_seen, origin.op + 1);
  }
}

void MemoryRecorder::RemoveFromCells(int device, int64_t size, const Attribution& block) {
  Cells* cells = CellsOf(device);
  if (cells == nullptr) return;
  cells->live[CellIndex(block.module, block.category)].fetch_sub(
      size, std::memory_order_relaxed);
  cells->category_live[static_cast<size_t>(block.category)].fetch_sub(
      size, std::memory_order_relaxed);
}

void MemoryRecorder::Record(HistoryAction action, int device, uint64_t addr, int64_t size,
                            const Attribution& a) {
  HistoryEntry e;
  e.addr = addr;
  e.size = size;
  e.time_us = NowUs();
  e.step = a.step;
  e.action = action;
  e.device = static_cast<int8_t>(device);
  e.phase = a.phase;
  e.category = a.category;
  e.module = a.module;
  e.op = a.op;
  history_.Append(e);
}

void MemoryRecorder::RecordFree(int device, uint64_t addr, int64_t size,
                                const Attribution& block) {
  DeviceCounters* c = Slot(device);
  if (c == nullptr) return;
  c->current.fetch_sub(size, std::memory_order_relaxed);
  c->frees.fetch_add(1, std::memory_order_relaxed);
  RemoveFromCells(device, size, block);
  if (recording_.load(std::memory_order_relaxed)) {
    Attribution at = block;
    at.step = CurrentStep();
    at.phase = CurrentPhase();
    Record(HistoryAction::kFree, device, addr, size, at);
  }
}

void MemoryRecorder::Retag(int device, int64_t size, const Attribution& from,
                           ModuleId to_module, Category to_category) {
  if (Slot(device) == nullptr) return;
  Cells* cells = CellsOf(device);
  cells->live[CellIndex(from.module, from.category)].fetch_sub(size,
                                                               std::memory_order_relaxed);
  cells->category_live[static_cast<size_t>(from.category)].fetch_sub(
      size, std::memory_order_relaxed);
  const size_t cell = CellIndex(to_module, to_category);
  const int64_t held =
      cells->live[cell].fetch_add(size, std::memory_order_relaxed) + size;
  UpdateMax(
      cells->phase_peak[static_cast<size_t>(PhaseIndex(CurrentPhase())) * kCells + cell],
      held);
  const int64_t category_held =
      cells->category_live[static_cast<size_t>(to_category)].fetch_add(
          size, std::memory_order_relaxed) +
      size;
  UpdateMax(cells->category_peak[static_cast<size_t>(PhaseIndex(CurrentPhase())) *
                                     kNumCategories +
                                 static_cast<size_t>(to_category)],
            category_held);
  RaiseTo(cells->modules_seen, to_module + 1);
}

std::array<int64_t, kNumCategories> MemoryRecorder::CategoryBytesOf(int device) const {
  std::array<int64_t, kNumCategories> out{};
  const Cells* cells = CellsOf(device);
  if (cells == nullptr) return out;
  for (int i = 0; i < kNumCategories; ++i) {
    out[static_cast<size_t>(i)] =
        cells->category_live[static_cast<size_t>(i)].load(std::memory_order_relaxed);
  }
  return out;
}

std::vector<CellBytes> MemoryRecorder::LiveCells() const {
  std::vector<CellBytes> out;
  for (int device = kCpuDevice; device < kMaxCudaDevices; ++device) {
    const Cells* cells = CellsOf(device);
    if (cells == nullptr) continue;
    const int modules = cells->modules_seen.load(std::memory_order_relaxed);
    for (int m = 0; m < modules; ++m) {
      for (int k = 0; k < kNumCategories; ++k) {
        const int64_t bytes =
            cells->live[CellIndex(static_cast<ModuleId>(m), static_cast<Category>(k))]
                .load(std::memory_order_relaxed);
        if (bytes != 0) {
          out.push_back(
              {device, static_cast<ModuleId>(m), static_cast<Category>(k), bytes});
        }
      }
    }
  }
  return out;
}

std::vector<StepAttribution> MemoryRecorder::StepRecords() const {
  absl::MutexLock lock(&published_mu_);
  return std::vector<StepAttribution>(step_records_.begin(), step_records_.end());
}

void MemoryRecorder::ClearStepRecords() {
  absl::MutexLock lock(&published_mu_);
  step_records_.clear();
}

std::vector<OpBytes> MemoryRecorder::OpBytesTotal() const {
  absl::MutexLock lock(&published_mu_);
  return op_totals_;
}

void MemoryRecorder::FoldCudaPeaks(Phase ended_phase) {
#ifdef MEMPROFD_WITH_CUDA
  std::vector<CudaDeviceSample> samples = SampleCudaDevices();
  for (const CudaDeviceSample& s : samples) {
    DeviceCounters* c = Slot(s.device);
    if (c == nullptr) continue;
    c->seen.store(true, std::memory_order_relaxed);
    c->current.store(s.allocated_bytes, std::memory_order_relaxed);
    c->allocs.store(s.alloc_count, std::memory_order_relaxed);
    c->frees.store(s.free_count, std::memory_order_relaxed);
    UpdateMax(c->peak, s.peak_allocated_bytes);
    UpdateMax(c->phase_peak[static_cast<size_t>(PhaseIndex(ended_phase))],
              s.peak_allocated_bytes);
    UpdateMax(c->peak_reserved, s.peak_reserved_bytes);
    UpdateMax(c->peak_active, s.peak_active_bytes);
  }
  if (!samples.empty()) ResetCudaPeaks();
#else
  (void)ended_phase;
#endif
}

void MemoryRecorder::OnStepBegin(int64_t /*global_step*/) {
  const Phase phase = CurrentPhase();
  FoldCudaPeaks(static_cast<Phase>(phase_.load(std::memory_order_relaxed)));
  phases_seen_.store(1u << PhaseIndex(phase), std::memory_order_relaxed);
  for (DeviceCounters& c : devices_) {
    for (auto& p : c.phase_peak) p.store(0, std::memory_order_relaxed);
    c.phase_peak[static_cast<size_t>(PhaseIndex(phase))].store(
        c.current.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  for (auto& slot : cells_) {
    Cells* cells = slot.load(std::memory_order_acquire);
    if (cells == nullptr) continue;
    const size_t used =
        static_cast<size_t>(cells->modules_seen.load(std::memory_order_relaxed)) *
        kNumCategories;
    for (int p = 0; p < kNumPhases; ++p) {
      for (size_t i = 0; i < used; ++i) {
        cells->phase_peak[static_cast<size_t>(p) * kCells + i].store(
            0, std::memory_order_relaxed);
      }
    }
    const int ops = cells->ops_seen.load(std::memory_order_relaxed);
    for (int o = 0; o < ops; ++o) {
      cells->op_bytes[static_cast<size_t>(o)].store(0, std::memory_order_relaxed);
    }
    for (auto& p : cells->category_peak) p.store(0, std::memory_order_relaxed);
  }
  SeedCellPeaks(phase);
}

void MemoryRecorder::SeedCellPeaks(Phase phase) {
  for (auto& slot : cells_) {
    Cells* cells = slot.load(std::memory_order_acquire);
    if (cells == nullptr) continue;
    const size_t used =
        static_cast<size_t>(cells->modules_seen.load(std::memory_order_relaxed)) *
        kNumCategories;
    const size_t base = static_cast<size_t>(PhaseIndex(phase)) * kCells;
    for (size_t i = 0; i < used; ++i) {
      UpdateMax(cells->phase_peak[base + i],
                cells->live[i].load(std::memory_order_relaxed));
    }
    for (int k = 0; k < kNumCategories; ++k) {
      UpdateMax(
          cells->category_peak[static_cast<size_t>(PhaseIndex(phase)) * kNumCategories +
                               static_cast<size_t>(k)],
          cells->category_live[static_cast<size_t>(k)].load(std::memory_order_relaxed));
    }
  }
}

void MemoryRecorder::OnPhase(Phase phase) {
  const Phase ended = static_cast<Phase>(
      phase_.exchange(static_cast<int>(phase), std::memory_order_relaxed));
  FoldCudaPeaks(ended);
  phases_seen_.fetch_or(1u << PhaseIndex(phase), std::memory_order_relaxed);
  for (DeviceCounters& c : devices_) {
    UpdateMax(c.phase_peak[static_cast<size_t>(PhaseIndex(phase))],
              c.current.load(std::memory_order_relaxed));
  }
  SeedCellPeaks(phase);
}

StepAttribution MemoryRecorder::CollectStepAttribution(int64_t global_step,
                                                       uint32_t phases_seen) const {
  StepAttribution record;
  record.step = global_step;
  for (int device = kCpuDevice; device < kMaxCudaDevices; ++device) {
    const Cells* cells = CellsOf(device);
    if (cells == nullptr) continue;
    const int modules = cells->modules_seen.load(std::memory_order_relaxed);
    for (int m = 0; m < modules; ++m) {
      for (int k = 0; k < kNumCategories; ++k) {
        const auto module = static_cast<ModuleId>(m);
        const auto category = static_cast<Category>(k);
        const size_t cell = CellIndex(module, category);
        const int64_t live = cells->live[cell].load(std::memory_order_relaxed);
        if (live != 0) record.live_at_end.push_back({device, module, category, live});
        for (int p = 0; p < kNumPhases; ++p) {
          if ((phases_seen & (1u << p)) == 0) continue;
          const int64_t peak =
              cells->phase_peak[static_cast<size_t>(p) * kCells + cell].load(
                  std::memory_order_relaxed);
          if (peak > 0) {
            record.phase_peaks.push_back(
                {device, module, category, static_cast<Phase>(p), peak});
          }
        }
      }
    }
    for (int p = 0; p < kNumPhases; ++p) {
      if ((phases_seen & (1u << p)) == 0) continue;
      for (int k = 0; k < kNumCategories; ++k) {
        const int64_t peak = cells
                                 ->category_peak[static_cast<size_t>(p) * kNumCategories +
                                                 static_cast<size_t>(k)]
                                 .load(std::memory_order_relaxed);
        if (peak > 0) {
          record.category_phase_peaks.push_back(
              {device, 0, static_cast<Category>(k), static_cast<Phase>(p), peak});
        }
      }
    }
    const int ops = cells->ops_seen.load(std::memory_order_relaxed);
    for (int o = 0; o < ops; ++o) {
      const int64_t bytes =
          cells->op_bytes[static_cast<size_t>(o)].load(std::memory_order_relaxed);
      if (bytes > 0) record.op_bytes.push_back({device, static_cast<OpId>(o), bytes});
    }
  }
  return record;
}

void MemoryRecorder::OnStepEnd(int64_t global_step) {
  FoldCudaPeaks(static_cast<Phase>(phase_.load(std::memory_order_relaxed)));
  const uint32_t seen = phases_seen_.load(std::memory_order_relaxed);
  Published next;
  next.step = global_step;
  for (int device = kCpuDevice; device < kMaxCudaDevices; ++device) {
    const DeviceCounters& c = *Slot(device);
    if (device != kCpuDevice && !c.seen.load(std::memory_order_relaxed)) continue;
    const std::string name = DeviceName(device);
    int64_t step_peak = 0;
    for (int p = 0; p < kNumPhases; ++p) {
      const int64_t peak =
          c.phase_peak[static_cast<size_t>(p)].load(std::memory_order_relaxed);
      if ((seen & (1u << p)) == 0 && peak == 0) continue;
      next.phase_peaks.push_back({name, static_cast<Phase>(p), peak});
      step_peak = std::max(step_peak, peak);
    }
    next.step_peaks.push_back({name, step_peak});
  }
  StepAttribution record = CollectStepAttribution(global_step, seen);
  absl::MutexLock lock(&published_mu_);
  published_ = std::move(next);
  for (const OpBytes& o : record.op_bytes) {
    auto it = std::find_if(op_totals_.begin(), op_totals_.end(), [&](const OpBytes& t) {
      return t.device == o.device && t.op == o.op;
    });
    if (it == op_totals_.end()) {
      op_totals_.push_back(o);
    } else {
      it->bytes += o.bytes;
    }
  }
  step_records_.push_back(std::move(record));
  while (step_records_.size() > static_cast<size_t>(kStepRecords))
    step_records_.pop_front();
}

void MemoryRecorder::ResetPeak() {
  for (DeviceCounters& c : devices_) {
    c.peak.store(c.current.load(std::memory_order_relaxed), std::memory_order_relaxed);
    c.peak_reserved.store(0, std::memory_order_relaxed);
    c.peak_active.store(0, std::memory_order_relaxed);
  }
#ifdef MEMPROFD_WITH_CUDA
  ResetCudaPeaks();
#endif
}

void MemoryRecorder::AppendLiveBlocks() {
  const int64_t now = NowUs();
  for (const LiveBlock& b : LiveCpuBlocks()) {
    HistoryEntry e;
    e.addr = b.addr;
    e.size = b.size;
    e.time_us = now;
    e.step = b.origin.step;
    e.action = HistoryAction::kAlloc;
    e.device = static_cast<int8_t>(b.device);
    e.phase = b.origin.phase;
    e.category = b.origin.category;
    e.module = b.origin.module;
    e.op = b.origin.op;
    history_.Append(e);
  }
}

absl::Status MemoryRecorder::StartRecording(int64_t max_entries) {
  const bool fresh = history_.size() == 0;
  absl::Status status = history_.Start(max_entries);
  // The ring records from here, the recorder's own events only from the
  // store below: the live blocks listed in between come first.
  if (status.ok() && fresh && this == &Global()) AppendLiveBlocks();
  if (status.ok()) recording_.store(true, std::memory_order_relaxed);
#ifdef MEMPROFD_WITH_CUDA
  if (status.ok() && track_cuda_.load(std::memory_order_relaxed)) {
    SetCudaHistory(true, max_entries).IgnoreError();
  }
#endif
  return status;
}

void MemoryRecorder::StopRecording() {
  recording_.store(false, std::memory_order_relaxed);
  history_.Stop();
#ifdef MEMPROFD_WITH_CUDA
  SetCudaHistory(false, 0).IgnoreError();
#endif
}

void MemoryRecorder::ClearHistory() {
  history_.Clear();
#ifdef MEMPROFD_WITH_CUDA
  ClearCudaHistory();
#endif
}

HistorySnapshot MemoryRecorder::History() const { return history_.Copy(); }

int64_t MemoryRecorder::HistoryPosition() const {
  const HistorySnapshot meta = history_.Copy(/*include_entries=*/false);
  return meta.dropped + meta.size;
}

MemoryStatsView MemoryRecorder::Stats() const {
  MemoryStatsView view;
  const DeviceCounters& cpu = *Slot(kCpuDevice);
  DeviceMemoryStats d;
  d.name = "cpu";
  d.index = kCpuDevice;
  d.current_bytes = cpu.current.load(std::memory_order_relaxed);
  d.peak_bytes = cpu.peak.load(std::memory_order_relaxed);
  d.alloc_count = cpu.allocs.load(std::memory_order_relaxed);
  d.free_count = cpu.frees.load(std::memory_order_relaxed);
  view.devices.push_back(d);
#ifdef MEMPROFD_WITH_CUDA
  for (const CudaDeviceSample& s : SampleCudaDevices()) {
    const DeviceCounters* c = Slot(s.device);
    if (c == nullptr) continue;
    DeviceMemoryStats g;
    g.name = DeviceName(s.device);
    g.index = s.device;
    g.current_bytes = s.allocated_bytes;
    g.peak_bytes =
        std::max(c->peak.load(std::memory_order_relaxed), s.peak_allocated_bytes);
    g.alloc_count = s.alloc_count;
    g.free_count = s.free_count;
    g.has_cuda_stats = true;
    g.reserved_bytes = s.reserved_bytes;
    g.peak_reserved_bytes =
        std::max(c->peak_reserved.load(std::memory_order_relaxed), s.peak_reserved_bytes);
    g.active_bytes = s.active_bytes;
    g.peak_active_bytes =
        std::max(c->peak_active.load(std::memory_order_relaxed), s.peak_active_bytes);
    g.alloc_retries = s.alloc_retries;
    g.ooms = s.ooms;
    view.devices.push_back(g);
  }
#endif
  {
    absl::MutexLock lock(&published_mu_);
    view.last_step = published_.step;
    view.last_step_phase_peaks = published_.phase_peaks;
    view.last_step_peaks = published_.step_peaks;
  }
  view.current_phase = CurrentPhase();
  view.current_step = CurrentStep();
  view.cpu_allocator_installed = IsCountingCpuAllocatorInstalled();
  const HistorySnapshot meta = history_.Copy(/*include_entries=*/false);
  view.recording = meta.recording;
  view.history_entries = meta.size;
  view.history_max_entries = meta.max_entries;
  view.history_dropped = meta.dropped;
  return view;
}

int64_t MemoryRecorder::CurrentBytes(int device) const {
  const DeviceCounters* c = Slot(device);
  return c ? c->current.load(std::memory_order_relaxed) : 0;
}

int64_t MemoryRecorder::PeakBytes(int device) const {
  const DeviceCounters* c = Slot(device);
  return c ? c->peak.load(std::memory_order_relaxed) : 0;
}

int64_t MemoryRecorder::AllocCount(int device) const {
  const DeviceCounters* c = Slot(device);
  return c ? c->allocs.load(std::memory_order_relaxed) : 0;
}

int64_t MemoryRecorder::FreeCount(int device) const {
  const DeviceCounters* c = Slot(device);
  return c ? c->frees.load(std::memory_order_relaxed) : 0;
}

}  // namespace memory
}  // namespace memprofd
