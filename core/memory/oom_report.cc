#include "core/memory/oom_report.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/attribution.h"
#include "core/memory/cpu_allocator.h"
#include "core/memory/recorder.h"
#ifdef MEMPROFD_WITH_CUDA
#include "core/memory/cuda_stats.h"
#endif

namespace memprofd {
namespace memory {
namespace {

// A block with no attribution (made before it was installed) and no
// category by address.
constexpr absl::string_view kRemainder = "unknown";

// The newest capture. std::mutex: taken on the failing thread, which may be
// any thread.
std::mutex g_capture_mu;
std::optional<OomCapture>* g_capture = new std::optional<OomCapture>();  // leaked

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A "Key: N kB" line of /proc/meminfo, in bytes; -1 when absent. Reads into
// a stack buffer: this runs right after an allocation failed.
int64_t MeminfoBytes(const char* key) {
  const int fd = ::open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* at = std::strstr(buf, key);
  if (at == nullptr) return -1;
  return std::strtoll(at + std::strlen(key), nullptr, 10) * 1024;
}

// Address-space bytes in use (VmSize), from /proc/self/statm; -1 unknown.
int64_t AddressSpaceBytes() {
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  return std::strtoll(buf, nullptr, 10) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

// Narrows a device's free and total bytes (-1: unknown) to what a cap of
// `cap` bytes leaves when `used` of them are in use (used < 0: unknown,
// only the total is capped).
void CapRoom(int64_t cap, int64_t used, int64_t* free_bytes, int64_t* total_bytes) {
  if (used >= 0) {
    const int64_t left = std::max<int64_t>(0, cap - used);
    *free_bytes = *free_bytes < 0 ? left : std::min(*free_bytes, left);
  }
  *total_bytes = *total_bytes < 0 ? cap : std::min(*total_bytes, cap);
}

void FillCpuFigures(OomCapture* c) {
  c->allocated_bytes = MemoryRecorder::Global().CurrentBytes(kCpuDevice);
  c->reserved_bytes = c->allocated_bytes;
  c->free_bytes = MeminfoBytes("MemAvailable:");
  c->total_bytes = MeminfoBytes("MemTotal:");
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    CapRoom(static_cast<int64_t>(limit.rlim_cur), AddressSpaceBytes(), &c->free_bytes,
            &c->total_bytes);
  }
  // The device memory limit: what it leaves is all there is.
  if (const int64_t cap = CpuMemoryLimit(); cap > 0) {
    CapRoom(cap, CpuAllocatedBytes(), &c->free_bytes, &c->total_bytes);
  }
}

DeviceRoom CpuRoom() {
  OomCapture c;
  FillCpuFigures(&c);
  return {c.free_bytes, c.total_bytes};
}

#ifdef MEMPROFD_WITH_CUDA
void FillCudaFigures(OomCapture* c) {
  for (const CudaDeviceSample& s : SampleCudaDevices()) {
    if (s.device != c->device) continue;
    c->allocated_bytes = s.allocated_bytes;
    c->reserved_bytes = s.reserved_bytes;
  }
  if (IsCudaAccountingAttached()) {
    // Every block allocated since the attach, with its attribution.
    for (const LiveBlock& b : LiveCudaBlocks()) {
      if (b.device == c->device) c->live.push_back(b);
    }
    return;
  }
  // Without the accounting, the allocator's own blocks, unattributed. Blocks
  // tile each segment in address order.
  for (const VizSegment& segment : CaptureCudaSnapshot().segments) {
    if (segment.device != c->device) continue;
    uint64_t addr = segment.address;
    for (const VizBlock& block : segment.blocks) {
      if (block.state == VizBlockState::kActiveAllocated) {
        c->live.push_back({c->device, addr,
                           block.requested_size > 0 ? block.requested_size : block.size,
                           Attribution()});
      }
      addr += static_cast<uint64_t>(block.size);
    }
  }
}
#endif

Json OptionalPhase(const std::optional<Phase>& phase) {
  return phase ? Json(std::string(PhaseName(*phase))) : Json(nullptr);
}

Json OrNull(int64_t v) { return v < 0 ? Json(nullptr) : Json(v); }

// By CategoryName; a name that is none (or "unknown") counts as unknown.
void AddToCategory(CategoryBytes* c, absl::string_view name, int64_t bytes) {
  const Category category = CategoryFromName(name).value_or(Category::kUnknown);
  c->Of(category) += bytes;
  if (category == Category::kSavedActivations || category == Category::kTemporaries) {
    c->activations_and_temporaries += bytes;
  }
}

}  // namespace

DeviceRoom QueryDeviceRoom(int device) {
  if (device == kCpuDevice) return CpuRoom();
#ifdef MEMPROFD_WITH_CUDA
  DeviceRoom room;
  if (!CudaMemInfo(device, &room.free_bytes, &room.total_bytes)) return {};
  int64_t allocated = 0;
  for (const CudaDeviceSample& s : SampleCudaDevices()) {
    if (s.device != device) continue;
    room.free_bytes += std::max<int64_t>(0, s.reserved_bytes - s.allocated_bytes);
    allocated = s.allocated_bytes;
  }
  // The device memory limit: the allocator reserves no more than it.
  if (const int64_t cap = CudaMemoryLimit(device); cap > 0) {
    CapRoom(cap, allocated, &room.free_bytes, &room.total_bytes);
  }
  return room;
#else
  return {};
#endif
}

void NoteAllocationFailure(int device, int64_t requested_bytes, int64_t free_bytes,
                           int64_t total_bytes) {
  OomCapture c;
  c.device = device;
  c.requested_bytes = requested_bytes;
  c.phase = CurrentPhase();
  c.step = CurrentStep();
  // The failing thread's module and op: what asked for the bytes.
  c.request_origin = CurrentAttribution();
  c.unix_time_ms = NowUnixMs();
  c.history_position = MemoryRecorder::Global().HistoryPosition();
  try {
    if (device == kCpuDevice) {
      FillCpuFigures(&c);
      c.live = LiveCpuBlocks();
    } else {
#ifdef MEMPROFD_WITH_CUDA
      FillCudaFigures(&c);
#endif
    }
  } catch (...) {
    // Out of memory for the list itself: keep what was filled.
  }
  if (free_bytes >= 0) c.free_bytes = free_bytes;
  if (total_bytes >= 0) c.total_bytes = total_bytes;
#ifdef MEMPROFD_WITH_CUDA
  // The device memory limit, where the allocator's figures are the device's.
  if (device != kCpuDevice) {
    if (const int64_t cap = CudaMemoryLimit(device); cap > 0) {
      CapRoom(cap, c.allocated_bytes, &c.free_bytes, &c.total_bytes);
    }
  }
#endif
  std::lock_guard<std::mutex> lock(g_capture_mu);
  *g_capture = std::move(c);
}

std::optional<OomCapture> TakeOomCapture() {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  std::optional<OomCapture> out = std::move(*g_capture);
  g_capture->reset();
  return out;
}

#ifndef MEMPROFD_WITH_CUDA
void InstallCudaOomObserver() {}
#endif

OomReport BuildOomReport(const std::optional<OomCapture>& capture,
                         const OomReportInputs& inputs) {
  OomReport r;
  r.error = inputs.error;
  r.global_step = inputs.global_step;
  r.recent_steps = inputs.recent_steps;
  if (r.recent_steps.size() > static_cast<size_t>(OomReport::kRecentSteps)) {
    r.recent_steps.erase(r.recent_steps.begin(),
                         r.recent_steps.end() - OomReport::kRecentSteps);
  }
  r.categories.offloaded_host = inputs.offloaded_host_bytes;
  r.categories.offloaded_disk = inputs.offloaded_disk_bytes;
  r.categories.snapshot_staging = inputs.snapshot_staging_bytes;
  if (!capture) {
    r.failed_at_unix_ms = NowUnixMs();
    r.phase = CurrentPhase();
    return r;
  }
  const OomCapture& c = *capture;
  r.captured = true;
  r.failed_at_unix_ms = c.unix_time_ms;
  r.device = DeviceName(c.device);
  r.requested_bytes = c.requested_bytes;
  r.phase = c.phase;
  r.module = ModuleName(c.request_origin.module);
  r.op = OpName(c.request_origin.op);
  r.allocated_bytes = c.allocated_bytes;
  r.reserved_bytes = c.reserved_bytes;
  r.free_bytes = c.free_bytes;
  r.total_bytes = c.total_bytes;

  // Phase and step of each live address: its newest allocation in the
  // history (entries are in event order) before the failure; the frees of
  // the unwinding come after it.
  struct Origin {
    Phase phase;
    int64_t step;
  };
  absl::flat_hash_map<uint64_t, Origin> origin;
  const int64_t before_failure = c.history_position - inputs.history_dropped;
  for (int64_t i = 0;
       i < static_cast<int64_t>(inputs.history.size()) && i < before_failure; ++i) {
    const HistoryEntry& e = inputs.history[static_cast<size_t>(i)];
    if (e.device != c.device) continue;
    if (e.action == HistoryAction::kAlloc) {
      origin[e.addr] = Origin{e.phase, e.step};
    } else {
      origin.erase(e.addr);
    }
  }
  std::vector<LiveAllocation> all;
  all.reserve(c.live.size());
  for (const LiveBlock& b : c.live) {
    LiveAllocation a;
    a.addr = b.addr;
    a.bytes = b.size;
    // The block's own attribution (module, op, category, phase, step, kept
    // by the allocator since it was made) where it has one; otherwise the
    // category by address and the phase and step from the history.
    a.module = ModuleName(b.origin.module);
    a.op = OpName(b.origin.op);
    if (b.origin.category != Category::kUnknown) {
      a.category = std::string(CategoryName(b.origin.category));
      a.phase = b.origin.phase;
      a.step = b.origin.step;
    } else {
      auto category = inputs.category_of.find(b.addr);
      a.category = category != inputs.category_of.end() ? category->second
                                                        : std::string(kRemainder);
      if (auto o = origin.find(b.addr); o != origin.end()) {
        a.phase = o->second.phase;
        a.step = o->second.step;
      }
    }
    AddToCategory(&r.categories, a.category, a.bytes);
    r.live_bytes += a.bytes;
    all.push_back(std::move(a));
  }
  r.live_allocations = static_cast<int64_t>(all.size());
  const size_t keep = std::min(all.size(), static_cast<size_t>(OomReport::kLargest));
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(keep),
                    all.end(), [](const LiveAllocation& a, const LiveAllocation& b) {
                      return a.bytes != b.bytes ? a.bytes > b.bytes : a.addr < b.addr;
                    });
  all.resize(keep);
  r.largest = std::move(all);
  return r;
}

Json StepPeaksToJson(const StepPeaks& p) {
  Json out = Json::object();
  out["step"] = p.step;
  Json devices = Json::array();
  for (const StepPeak& s : p.peaks) {
    Json d = Json::object();
    d["device"] = s.device;
    d["peak_bytes"] = s.peak_bytes;
    Json phases = Json::object();
    for (const PhasePeak& ph : p.phase_peaks) {
      if (ph.device == s.device) phases[std::string(PhaseName(ph.phase))] = ph.peak_bytes;
    }
    d["phase_peak_bytes"] = std::move(phases);
    devices.push_back(std::move(d));
  }
  out["devices"] = std::move(devices);
  Json categories = Json::object();
  for (const auto& [name, bytes] : p.categories_at_end.Named()) categories[name] = bytes;
  out["category_bytes_at_end"] = std::move(categories);
  return out;
}

Json OomReportToJson(const OomReport& r) {
  Json out = Json::object();
  out["kind"] = "memprofd.oom_report";
  out["version"] = 1;
  out["error"] = r.error;
  out["global_step"] = r.global_step;
  out["failed_at_unix_ms"] = r.failed_at_unix_ms;
  out["captured"] = r.captured;
  Json request = Json::object();
  request["device"] = r.device;
  request["bytes"] = r.requested_bytes;
  request["phase"] = OptionalPhase(r.phase);
  request["module"] = r.module;
  request["op"] = r.op;
  out["request"] = std::move(request);
  Json device = Json::object();
  device["name"] = r.device;
  device["allocated_bytes"] = r.allocated_bytes;
  device["reserved_bytes"] = OrNull(r.reserved_bytes);
  device["free_bytes"] = OrNull(r.free_bytes);
  device["total_bytes"] = OrNull(r.total_bytes);
  out["device"] = std::move(device);
  Json live = Json::object();
  live["count"] = r.live_allocations;
  live["bytes"] = r.live_bytes;
  out["live_allocations"] = std::move(live);
  Json largest = Json::array();
  for (const LiveAllocation& a : r.largest) {
    Json j = Json::object();
    j["address"] = absl::StrFormat("0x%x", a.addr);
    j["bytes"] = a.bytes;
    j["category"] = a.category;
    j["phase"] = OptionalPhase(a.phase);
    j["step"] = a.step ? Json(*a.step) : Json(nullptr);
    j["module"] = a.module;
    j["op"] = a.op;
    largest.push_back(std::move(j));
  }
  out["largest_allocations"] = std::move(largest);
  Json categories = Json::object();
  for (const auto& [name, bytes] : r.categories.Named()) categories[name] = bytes;
  out["category_bytes"] = std::move(categories);
  Json steps = Json::array();
  for (const StepPeaks& p : r.recent_steps) steps.push_back(StepPeaksToJson(p));
  out["recent_steps"] = std::move(steps);
  return out;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  auto fail = [&](absl::string_view what) {
    const int err = errno;
    return absl::Status(
        absl::ErrnoToStatusCode(err),
        absl::StrCat("cannot ", what, " '", tmp, "': ", std::strerror(err),
                     "; check the directory exists and is writable"));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("create");
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status s = fail("write");
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    absl::Status s = fail("close");
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = fail("rename");
    ::unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

}  // namespace memory
}  // namespace memprofd
