#include "core/memory/memory_viz.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/memory/cpu_allocator.h"
#include "core/memory/pickle_writer.h"
#include "core/memory/recorder.h"
#ifdef MEMPROFD_WITH_CUDA
#include "core/memory/cuda_stats.h"
#endif

namespace memprofd {
namespace memory {
namespace {

const char* StateName(VizBlockState s) {
  switch (s) {
    case VizBlockState::kActiveAllocated:
      return "active_allocated";
    case VizBlockState::kActivePendingFree:
      return "active_pending_free";
    case VizBlockState::kInactive:
      return "inactive";
  }
  return "inactive";
}

const char* ActionName(VizAction a) {
  switch (a) {
    case VizAction::kAlloc:
      return "alloc";
    case VizAction::kFreeRequested:
      return "free_requested";
    case VizAction::kFreeCompleted:
      return "free_completed";
    case VizAction::kSegmentAlloc:
      return "segment_alloc";
    case VizAction::kSegmentFree:
      return "segment_free";
  }
  return "alloc";
}

// Where an event came from, shown by the viewer as a one-line stack.
struct Origin {
  bool known = false;
  Phase phase = Phase::kIdle;
  int64_t step = 0;
};

// Writes an event's frames list: one frame naming the phase and step, or an
// empty list when the origin is unknown. Each distinct list is written once
// and referenced from the pickle memo afterwards.
class FramesWriter {
 public:
  void Write(PickleWriter& w, const Origin& o) {
    const std::pair<int, int64_t> key =
        o.known ? std::make_pair(static_cast<int>(o.phase), o.step)
                : std::make_pair(-1, 0L);
    auto it = memo_.find(key);
    if (it != memo_.end()) {
      w.Recall(it->second);
      return;
    }
    w.BeginList();
    if (o.known) {
      w.BeginDict();
      w.Key("filename");
      w.InternedStr("memprofd");
      w.Key("line");
      w.Int(o.step);
      w.Key("name");
      w.Str(absl::StrCat(PhaseName(o.phase), " step ", o.step));
      w.EndDict();
    }
    w.EndList();
    memo_.emplace(key, w.Remember());
  }

 private:
  absl::flat_hash_map<std::pair<int, int64_t>, int64_t> memo_;
};

void WriteTraceEntry(PickleWriter& w, FramesWriter& frames, const char* action,
                     uint64_t addr, int64_t size, int64_t time_us, const Origin& origin) {
  w.BeginDict();
  w.Key("action");
  w.InternedStr(action);
  w.Key("addr");
  w.UInt(addr);
  w.Key("size");
  w.Int(size);
  w.Key("stream");
  w.Int(0);
  w.Key("time_us");
  w.Int(time_us);
  w.Key("frames");
  frames.Write(w, origin);
  w.EndDict();
}

struct LiveInfo {
  int64_t size = 0;
  Origin origin;
};

// One CPU viewer segment: [start, end) with the live blocks inside it.
struct CpuSegment {
  uint64_t start = 0;
  uint64_t end = 0;
};

void WriteSegment(PickleWriter& w, FramesWriter& frames, int device, uint64_t address,
                  int64_t total_size, int64_t stream, const std::vector<VizBlock>& blocks,
                  const std::vector<uint64_t>& block_addrs,
                  const std::vector<Origin>& block_origins) {
  int64_t allocated = 0;
  for (const VizBlock& b : blocks) {
    if (b.state != VizBlockState::kInactive) allocated += b.size;
  }
  w.BeginDict();
  w.Key("device");
  w.Int(device);
  w.Key("address");
  w.UInt(address);
  w.Key("total_size");
  w.Int(total_size);
  w.Key("allocated_size");
  w.Int(allocated);
  w.Key("active_size");
  w.Int(allocated);
  w.Key("requested_size");
  w.Int(allocated);
  w.Key("stream");
  w.Int(stream);
  w.Key("segment_type");
  w.InternedStr("large");
  w.Key("segment_pool_id");
  w.IntPair(0, 0);
  w.Key("is_expandable");
  w.Bool(false);
  w.Key("frames");
  frames.Write(w, Origin{});
  w.Key("blocks");
  w.BeginList();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const VizBlock& b = blocks[i];
    w.BeginDict();
    w.Key("address");
    w.UInt(block_addrs[i]);
    w.Key("size");
    w.Int(b.size);
    w.Key("requested_size");
    w.Int(b.requested_size);
    w.Key("state");
    w.InternedStr(StateName(b.state));
    w.Key("frames");
    frames.Write(w, block_origins[i]);
    w.EndDict();
  }
  w.EndList();
  w.EndDict();
}

// CPU segments: the union of live blocks and traced ranges, merged across
// gaps up to kCpuSegmentMergeGap, tiled with the live blocks.
void WriteCpuSegments(PickleWriter& w, FramesWriter& frames, int viz_device,
                      const std::map<uint64_t, LiveInfo>& live,
                      const std::vector<HistoryEntry>& cpu_events) {
  std::vector<CpuSegment> ranges;
  ranges.reserve(live.size() + cpu_events.size());
  for (const auto& [addr, info] : live) {
    ranges.push_back(
        {addr, addr + static_cast<uint64_t>(std::max<int64_t>(info.size, 1))});
  }
  for (const HistoryEntry& e : cpu_events) {
    ranges.push_back(
        {e.addr, e.addr + static_cast<uint64_t>(std::max<int64_t>(e.size, 1))});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const CpuSegment& a, const CpuSegment& b) { return a.start < b.start; });
  std::vector<CpuSegment> merged;
  for (const CpuSegment& r : ranges) {
    if (!merged.empty() &&
        r.start <= merged.back().end + static_cast<uint64_t>(kCpuSegmentMergeGap)) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  auto it = live.begin();
  for (const CpuSegment& seg : merged) {
    std::vector<VizBlock> blocks;
    std::vector<uint64_t> addrs;
    std::vector<Origin> origins;
    uint64_t cursor = seg.start;
    for (; it != live.end() && it->first < seg.end; ++it) {
      const uint64_t addr = it->first;
      const int64_t size = it->second.size;
      // Overlap can only come from a torn read; keep the tiling valid.
      if (addr < cursor || size <= 0) continue;
      if (addr > cursor) {
        blocks.push_back(
            {static_cast<int64_t>(addr - cursor), 0, VizBlockState::kInactive});
        addrs.push_back(cursor);
        origins.push_back({});
      }
      blocks.push_back({size, size, VizBlockState::kActiveAllocated});
      addrs.push_back(addr);
      origins.push_back(it->second.origin);
      cursor = addr + static_cast<uint64_t>(size);
    }
    if (cursor < seg.end) {
      blocks.push_back(
          {static_cast<int64_t>(seg.end - cursor), 0, VizBlockState::kInactive});
      addrs.push_back(cursor);
      origins.push_back({});
    }
    WriteSegment(w, frames, viz_device, seg.start,
                 static_cast<int64_t>(seg.end - seg.start), 0, blocks, addrs, origins);
  }
}

}  // namespace

std::string BuildMemoryVizPickle(const MemoryVizInput& in) {
  int num_cuda =
      std::max<int>(in.num_cuda_devices, static_cast<int>(in.cuda.device_traces.size()));
  for (const VizSegment& s : in.cuda.segments)
    num_cuda = std::max(num_cuda, s.device + 1);
  for (const HistoryEntry& e : in.history) {
    if (e.device != kCpuDevice) num_cuda = std::max(num_cuda, e.device + 1);
  }
  const int cpu_viz_device = num_cuda;
  auto viz_device = [&](int device) {
    return device == kCpuDevice ? cpu_viz_device : device;
  };

  // The live CPU set, made consistent with the trace.
  std::map<uint64_t, LiveInfo> live;
  for (const LiveBlock& b : in.live_blocks) {
    if (b.device == kCpuDevice) live[b.addr].size = b.size;
  }
  std::vector<HistoryEntry> cpu_events;
  for (const HistoryEntry& e : in.history) {
    if (e.device != kCpuDevice) continue;
    cpu_events.push_back(e);
    if (e.action == HistoryAction::kAlloc) {
      live[e.addr] = LiveInfo{e.size, Origin{true, e.phase, e.step}};
    } else {
      live.erase(e.addr);
    }
  }

  PickleWriter w;
  FramesWriter frames;
  w.BeginDict();
  w.Key("segments");
  w.BeginList();
  for (const VizSegment& s : in.cuda.segments) {
    std::vector<uint64_t> addrs;
    uint64_t a = s.address;
    for (const VizBlock& b : s.blocks) {
      addrs.push_back(a);
      a += static_cast<uint64_t>(b.size);
    }
    WriteSegment(w, frames, s.device, s.address, s.total_size, s.stream, s.blocks, addrs,
                 std::vector<Origin>(s.blocks.size()));
  }
  WriteCpuSegments(w, frames, cpu_viz_device, live, cpu_events);
  w.EndList();

  w.Key("device_traces");
  w.BeginList();
  for (int d = 0; d <= cpu_viz_device; ++d) {
    w.BeginList();
    if (d < cpu_viz_device && static_cast<size_t>(d) < in.cuda.device_traces.size()) {
      for (const VizTraceEntry& t : in.cuda.device_traces[static_cast<size_t>(d)]) {
        WriteTraceEntry(w, frames, ActionName(t.action), t.addr, t.size, t.time_us,
                        Origin{});
      }
    }
    for (const HistoryEntry& e : in.history) {
      if (viz_device(e.device) != d) continue;
      const Origin origin{true, e.phase, e.step};
      if (e.action == HistoryAction::kAlloc) {
        WriteTraceEntry(w, frames, "alloc", e.addr, e.size, e.time_us, origin);
      } else {
        WriteTraceEntry(w, frames, "free_requested", e.addr, e.size, e.time_us, origin);
        WriteTraceEntry(w, frames, "free_completed", e.addr, e.size, e.time_us, origin);
      }
    }
    w.EndList();
  }
  w.EndList();

  w.Key("allocator_settings");
  w.BeginDict();
  w.EndDict();
  w.EndDict();
  return w.Finish();
}

std::string CaptureMemoryVizPickle() {
  MemoryVizInput in;
  in.live_blocks = LiveCpuBlocks();
  in.history = MemoryRecorder::Global().History().entries;
#ifdef MEMPROFD_WITH_CUDA
  in.cuda = CaptureCudaSnapshot();
  in.num_cuda_devices = CudaDeviceCount();
#endif
  return BuildMemoryVizPickle(in);
}

}  // namespace memory
}  // namespace memprofd
