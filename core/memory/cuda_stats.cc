#include "core/memory/cuda_stats.h"

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/common/attribution.h"
#include "core/memory/recorder.h"

namespace memprofd {
namespace memory {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

constexpr size_t kAll = 0;  // StatType::AGGREGATE

using Traces = std::vector<std::vector<VizTraceEntry>>;

// The allocator's API changes shape between LibTorch releases without keeping
// old calls compiling: parameters are appended without defaults, and its
// structs move between namespaces (2.x moved TraceEntry, SegmentInfo and
// DeviceStats to c10::CachingDeviceAllocator). So each difference is met by
// overloads whose signature only exists when their expression compiles for
// this LibTorch, and types are taken from the values, never named. A call
// with Rank<N>{} picks the viable overload of highest rank.
template <int N>
struct Rank : Rank<N - 1> {};
template <>
struct Rank<0> {};

// Whether per-device allocator calls can be made: some device is visible
// and the allocator is set up (`devices` = CudaDeviceCount()). Before CUDA's
// lazy init the allocator has no devices and every per-device call throws a
// c10::Error (with a backtrace): too costly at every phase boundary of a CPU
// run on a GPU host.
bool AllocatorReady(int devices) {
  auto* allocator = cca::get();
  return devices > 0 && allocator != nullptr && allocator->initialized();
}

// memprofd's context, handed to the allocator's history as its context
// recorder instead of Python or C++ stacks: the allocating thread's
// attribution (module, op, category, phase, step), a 16-byte copy.
struct MemprofdContext final : c10::GatheredContext {
  Attribution origin;
};

std::shared_ptr<c10::GatheredContext> GatherMemprofdContext() {
  auto context = std::make_shared<MemprofdContext>();
  context->origin = CurrentAttribution();
  return context;
}

template <typename ContextPtr>
std::optional<Attribution> OriginOf(const ContextPtr& context) {
  if (const auto* c = dynamic_cast<const MemprofdContext*>(context.get())) {
    return c->origin;
  }
  return std::nullopt;
}

// One allocator trace entry in the viewer's terms; false for actions that
// memprofd's viewer input does not carry (snapshot markers, OOMs, expandable
// segment maps).
template <typename TraceEntry>
bool ToVizTraceEntry(const TraceEntry& t, VizTraceEntry* out) {
  using Action = typename TraceEntry::Action;
  switch (t.action_) {
    case Action::ALLOC:
      out->action = VizAction::kAlloc;
      break;
    case Action::FREE_REQUESTED:
      out->action = VizAction::kFreeRequested;
      break;
    case Action::FREE_COMPLETED:
      out->action = VizAction::kFreeCompleted;
      break;
    case Action::SEGMENT_ALLOC:
      out->action = VizAction::kSegmentAlloc;
      break;
    case Action::SEGMENT_FREE:
      out->action = VizAction::kSegmentFree;
      break;
    default:
      return false;
  }
  out->addr = static_cast<uint64_t>(t.addr_);
  out->size = static_cast<int64_t>(t.size_);
  out->origin = OriginOf(t.context_);
  return true;
}

template <typename Snapshot>
Traces TracesOf(const Snapshot& s) {
  Traces out;
  for (const auto& device_trace : s.device_traces) {
    std::vector<VizTraceEntry> entries;
    entries.reserve(device_trace.size());
    for (const auto& t : device_trace) {
      VizTraceEntry e;
      if (ToVizTraceEntry(t, &e)) entries.push_back(e);
    }
    out.push_back(std::move(entries));
  }
  return out;
}

// CUDA's lazy init, which gives the allocator its per-device state:
// recordHistory only reaches devices that exist then, and a device added by a
// later init starts with history off (so torch's own _record_memory_history
// inits first too). lazyInitDevice(kCUDA) where it exists (lazyInitCUDA warns
// as deprecated there), lazyInitCUDA before (2.6).
template <typename Context>
auto LazyInitCuda(Context& context, Rank<1>)
    -> decltype(context.lazyInitDevice(c10::DeviceType::CUDA)) {
  context.lazyInitDevice(c10::DeviceType::CUDA);
}
template <typename Context>
void LazyInitCuda(Context& context, Rank<0>) {
  context.lazyInitCUDA();
}

// recordHistory(enabled, context_recorder, max_entries, when) in 2.6;
// later releases appended `bool clearHistory`, then `const
// std::vector<std::string>& skip_actions`, without defaults. `when` is a
// template parameter so that each call is dependent: an overload whose call
// does not fit this release drops out instead of failing the build. Returns
// false when no known signature fits. The context recorder is memprofd's
// (GatherMemprofdContext); RecordContext::ALLOC keeps one per allocation
// (in the trace and on live blocks), none for frees.
template <typename Recorder, typename When>
auto RecordHistory(bool enabled, Recorder recorder, size_t max_entries, When when,
                   Rank<3>)
    -> decltype(cca::recordHistory(enabled, recorder, max_entries, when, true, {}),
                bool()) {
  // clearHistory: start from an empty trace (see SetCudaHistory). No
  // skip_actions: every action is wanted.
  cca::recordHistory(enabled, recorder, max_entries, when, true, {});
  return true;
}
template <typename Recorder, typename When>
auto RecordHistory(bool enabled, Recorder recorder, size_t max_entries, When when,
                   Rank<2>)
    -> decltype(cca::recordHistory(enabled, recorder, max_entries, when, true), bool()) {
  cca::recordHistory(enabled, recorder, max_entries, when, true);
  return true;
}
template <typename Recorder, typename When>
auto RecordHistory(bool enabled, Recorder recorder, size_t max_entries, When when,
                   Rank<1>)
    -> decltype(cca::recordHistory(enabled, recorder, max_entries, when), bool()) {
  cca::recordHistory(enabled, recorder, max_entries, when);
  return true;
}
template <typename Recorder, typename When>
bool RecordHistory(bool, Recorder, size_t, When, Rank<0>) {
  return false;
}

bool RecordHistory(bool enabled, size_t max_entries) {
  cca::CreateContextFn recorder = enabled ? &GatherMemprofdContext : nullptr;
  return RecordHistory(enabled, recorder, max_entries,
                       enabled ? cca::RecordContext::ALLOC : cca::RecordContext::NEVER,
                       Rank<3>{});
}

// The allocator's trace as memprofd's history sees it. The allocator empties
// its trace whenever recording is turned off (every release; some also
// when it is turned on again), while memprofd keeps its history until
// ClearHistory so that it can be dumped after StopRecording. So before every
// switch the allocator's entries move to `kept`, and a switch always leaves
// the allocator's trace empty, so that no entry is kept twice.
struct HeldHistory {
  absl::Mutex mu;
  bool recording ABSL_GUARDED_BY(mu) = false;
  size_t max_entries ABSL_GUARDED_BY(mu) = 1;  // Per device, as the allocator's.
  Traces kept ABSL_GUARDED_BY(mu);             // Index = CUDA ordinal.
};

HeldHistory& Held() {
  static HeldHistory* const held = new HeldHistory();
  return *held;
}

// Appends `more` to `into`, device by device, keeping the newest max_entries
// of each device (as the allocator's own ring does).
void AppendNewest(Traces& into, const Traces& more, size_t max_entries) {
  if (into.size() < more.size()) into.resize(more.size());
  for (size_t d = 0; d < more.size(); ++d) {
    std::vector<VizTraceEntry>& dst = into[d];
    dst.insert(dst.end(), more[d].begin(), more[d].end());
    if (dst.size() > max_entries) {
      dst.erase(dst.begin(), dst.end() - static_cast<std::ptrdiff_t>(max_entries));
    }
  }
}

// The live blocks the trace tracker saw allocated, per device. std::mutex,
// not absl::Mutex: the tracker runs at every CUDA allocation (see the note in
// history.h on their costs).
struct TrackedBlock {
  int64_t size = 0;  // As requested.
  Attribution origin;
};
struct alignas(64) DeviceBlocks {
  std::mutex mu;
  absl::flat_hash_map<uint64_t, TrackedBlock> live;  // Guarded by mu.
};
constexpr int kTrackedDevices = MemoryRecorder::kMaxCudaDevices;

std::array<DeviceBlocks, kTrackedDevices>& Tracked() {
  // Leaked: frees may come during static destruction.
  static auto* const blocks = new std::array<DeviceBlocks, kTrackedDevices>();
  return *blocks;
}

std::atomic<bool> g_accounting_attached{false};

// The tracker, on the allocating (or freeing) thread under the allocator's
// lock of the entry's device: it must not call into PyTorch. Block
// addresses are the storages' data pointers. An alloc takes the thread's
// attribution; the free request (when the allocator's allocated and
// requested bytes drop, whatever the streams still do) gives it back.
template <typename TraceEntry>
void TrackEntry(const TraceEntry& t) {
  using Action = typename TraceEntry::Action;
  const int device = static_cast<int>(t.device_);
  if (device < 0 || device >= kTrackedDevices) return;
  const auto addr = static_cast<uint64_t>(t.addr_);
  DeviceBlocks& d = Tracked()[static_cast<size_t>(device)];
  if (t.action_ == Action::ALLOC) {
    TrackedBlock b;
    b.size = static_cast<int64_t>(t.size_);
    b.origin = CurrentAttribution();
    std::optional<TrackedBlock> stale;
    {
      std::lock_guard<std::mutex> lock(d.mu);
      auto [it, inserted] = d.live.try_emplace(addr, b);
      if (!inserted) {
        // A free this tracker never saw (none is known to exist): the old
        // block's bytes leave its cells, so that they cannot drift.
        stale = it->second;
        it->second = b;
      }
    }
    if (stale)
      MemoryRecorder::Global().RecordAttributedFree(device, stale->size, stale->origin);
    MemoryRecorder::Global().RecordAttributedAlloc(device, b.size, b.origin);
  } else if (t.action_ == Action::FREE_REQUESTED) {
    TrackedBlock b;
    {
      std::lock_guard<std::mutex> lock(d.mu);
      auto it = d.live.find(addr);
      if (it == d.live.end()) return;  // Allocated before the tracker came.
      b = it->second;
      d.live.erase(it);
    }
    MemoryRecorder::Global().RecordAttributedFree(device, b.size, b.origin);
  }
}

}  // namespace

namespace {
// SetCudaMemoryLimit's limits by device index (0: none).
std::mutex g_limit_mu;
absl::flat_hash_map<int, int64_t> g_limits;
}  // namespace

absl::Status SetCudaMemoryLimit(int device, int64_t bytes) {
  int64_t free = 0;
  int64_t total = 0;
  if (!CudaMemInfo(device, &free, &total)) {
    return absl::FailedPreconditionError(
        absl::StrCat("device_memory_limit: cuda:", device, " is not there"));
  }
  if (bytes > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_memory_limit ", bytes, " is beyond cuda:", device, "'s ",
                     total, " bytes; give at most that, or 0 for no limit"));
  }
  try {
    // The per-device allocators exist once CUDA is initialised.
    LazyInitCuda(at::globalContext(), Rank<1>{});
    const double fraction =
        bytes > 0 ? static_cast<double>(bytes) / static_cast<double>(total) : 1.0;
    cca::setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("device_memory_limit: ", e.what()));
  }
  std::lock_guard<std::mutex> lock(g_limit_mu);
  g_limits[device] = std::max<int64_t>(0, bytes);
  return absl::OkStatus();
}

int64_t CudaMemoryLimit(int device) {
  std::lock_guard<std::mutex> lock(g_limit_mu);
  auto it = g_limits.find(device);
  return it == g_limits.end() ? 0 : it->second;
}

absl::Status AttachCudaAccounting() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (g_accounting_attached.load()) return absl::OkStatus();
  if (CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(
        "CUDA memory attribution: no CUDA device is visible");
  }
  try {
    LazyInitCuda(at::globalContext(), Rank<1>{});
    cca::attachAllocatorTraceTracker([](const auto& entry) { TrackEntry(entry); });
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("CUDA memory attribution: ", e.what()));
  }
  g_accounting_attached.store(true);
  return absl::OkStatus();
}

bool IsCudaAccountingAttached() { return g_accounting_attached.load(); }

std::optional<Attribution> CudaBlockAttribution(int device, uint64_t addr) {
  if (device < 0 || device >= kTrackedDevices) return std::nullopt;
  DeviceBlocks& d = Tracked()[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.live.find(addr);
  if (it == d.live.end()) return std::nullopt;
  return it->second.origin;
}

bool RetagCudaBlock(int device, uint64_t addr, ModuleId module, Category category) {
  if (device < 0 || device >= kTrackedDevices) return false;
  DeviceBlocks& d = Tracked()[static_cast<size_t>(device)];
  Attribution from;
  int64_t size = 0;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.live.find(addr);
    if (it == d.live.end()) return false;
    from = it->second.origin;
    if (from.module == module && from.category == category) return true;
    size = it->second.size;
    it->second.origin.module = module;
    it->second.origin.category = category;
  }
  MemoryRecorder::Global().Retag(device, size, from, module, category);
  return true;
}

std::vector<LiveBlock> LiveCudaBlocks() {
  std::vector<LiveBlock> out;
  for (int device = 0; device < kTrackedDevices; ++device) {
    DeviceBlocks& d = Tracked()[static_cast<size_t>(device)];
    std::lock_guard<std::mutex> lock(d.mu);
    for (const auto& [addr, b] : d.live) out.push_back({device, addr, b.size, b.origin});
  }
  return out;
}

int CudaDeviceCount() {
  try {
    return static_cast<int>(c10::cuda::device_count());
  } catch (const std::exception&) {
    return 0;
  }
}

std::vector<CudaDeviceSample> SampleCudaDevices() {
  std::vector<CudaDeviceSample> out;
  const int n = CudaDeviceCount();
  if (!AllocatorReady(n)) return out;
  for (int d = 0; d < n; ++d) {
    try {
      const auto stats = cca::getDeviceStats(static_cast<c10::DeviceIndex>(d));
      CudaDeviceSample s;
      s.device = d;
      s.allocated_bytes = stats.allocated_bytes[kAll].current;
      s.requested_bytes = stats.requested_bytes[kAll].current;
      s.peak_allocated_bytes = stats.allocated_bytes[kAll].peak;
      s.reserved_bytes = stats.reserved_bytes[kAll].current;
      s.peak_reserved_bytes = stats.reserved_bytes[kAll].peak;
      s.active_bytes = stats.active_bytes[kAll].current;
      s.peak_active_bytes = stats.active_bytes[kAll].peak;
      s.alloc_retries = stats.num_alloc_retries;
      s.ooms = stats.num_ooms;
      s.alloc_count = stats.allocation[kAll].allocated;
      s.free_count = stats.allocation[kAll].freed;
      out.push_back(s);
    } catch (const std::exception&) {
      // The allocator is not initialised for this device yet.
    }
  }
  return out;
}

bool CudaMemInfo(int device, int64_t* free_bytes, int64_t* total_bytes) {
  if (device < 0 || device >= CudaDeviceCount()) return false;
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return false;
  if (previous != device && cudaSetDevice(device) != cudaSuccess) return false;
  size_t free = 0;
  size_t total = 0;
  const cudaError_t rc = cudaMemGetInfo(&free, &total);
  if (previous != device) (void)cudaSetDevice(previous);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: the next CUDA call should not see it
    return false;
  }
  *free_bytes = static_cast<int64_t>(free);
  *total_bytes = static_cast<int64_t>(total);
  return true;
}

void ResetCudaPeaks() {
  const int n = CudaDeviceCount();
  if (!AllocatorReady(n)) return;
  for (int d = 0; d < n; ++d) {
    try {
      cca::resetPeakStats(static_cast<c10::DeviceIndex>(d));
    } catch (const std::exception&) {
    }
  }
}

void EmptyCudaCache() {
  if (!AllocatorReady(CudaDeviceCount())) return;
  try {
    cca::emptyCache();
  } catch (const std::exception&) {
  }
}

absl::Status SetCudaHistory(bool enabled, int64_t max_entries) {
  HeldHistory& h = Held();
  absl::MutexLock lock(&h.mu);
  try {
    if (h.recording) {
      const Traces recorded = TracesOf(cca::snapshot());
      RecordHistory(false, h.max_entries);
      h.recording = false;
      AppendNewest(h.kept, recorded, h.max_entries);
    }
    if (!enabled) return absl::OkStatus();
    if (CudaDeviceCount() == 0) {
      return absl::FailedPreconditionError(
          "CUDA allocator history: no CUDA device is visible");
    }
    LazyInitCuda(at::globalContext(), Rank<1>{});
    const size_t n = static_cast<size_t>(std::max<int64_t>(max_entries, 1));
    if (!RecordHistory(true, n)) {
      return absl::UnimplementedError(absl::StrCat(
          "CUDA allocator history: CUDACachingAllocator::recordHistory in LibTorch ",
          TORCH_VERSION,
          " has a signature memprofd does not know; only segments are dumped"));
    }
    h.recording = true;
    h.max_entries = n;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(
        "CUDA allocator history: ", e.what(),
        " (the cudaMallocAsync backend, PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, "
        "keeps none)"));
  }
  return absl::OkStatus();
}

void ClearCudaHistory() {
  HeldHistory& h = Held();
  absl::MutexLock lock(&h.mu);
  h.kept.clear();
  if (!h.recording) return;
  try {
    // Off then on: the one sequence that empties the allocator's trace in
    // every release. Allocations in between are not traced.
    RecordHistory(false, h.max_entries);
    h.recording = RecordHistory(true, h.max_entries);
  } catch (const std::exception&) {
    h.recording = false;
  }
}

CudaAllocatorSnapshot CaptureCudaSnapshot() {
  CudaAllocatorSnapshot out;
  HeldHistory& h = Held();
  absl::MutexLock lock(&h.mu);
  out.device_traces = h.kept;
  if (!AllocatorReady(CudaDeviceCount())) return out;
  try {
    const auto snap = cca::snapshot();
    for (const auto& seg : snap.segments) {
      VizSegment v;
      v.device = static_cast<int>(seg.device);
      v.address = static_cast<uint64_t>(seg.address);
      v.total_size = static_cast<int64_t>(seg.total_size);
      for (const auto& b : seg.blocks) {
        VizBlock vb;
        vb.size = static_cast<int64_t>(b.size);
        vb.requested_size = b.allocated ? static_cast<int64_t>(b.requested_size) : 0;
        vb.state = b.allocated ? VizBlockState::kActiveAllocated
                   : b.active  ? VizBlockState::kActivePendingFree
                               : VizBlockState::kInactive;
        if (b.allocated) vb.origin = OriginOf(b.context_when_allocated);
        v.blocks.push_back(vb);
      }
      out.segments.push_back(std::move(v));
    }
    AppendNewest(out.device_traces, TracesOf(snap), h.max_entries);
  } catch (const std::exception&) {
    out.segments.clear();
    out.device_traces = h.kept;
  }
  return out;
}

}  // namespace memory
}  // namespace memprofd
