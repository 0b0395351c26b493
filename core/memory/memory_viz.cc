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

// Where an event came from; unknown for the CUDA allocator's own entries
// recorded without memprofd's context.
using Origin = std::optional<Attribution>;

std::string FrameModule(ModuleId module) {
  std::string name = ModuleName(module);
  return name.empty() ? std::string("(no module)") : name;
}

std::string FrameOp(OpId op) {
  std::string name = OpName(op);
  return name.empty() ? std::string("(no op)") : name;
}

// Writes an event's frames list: {module, 0, op} then {"memprofd", step,
// "<phase> step <step>"}, or an empty list when the origin is unknown. Each
// distinct list is written once and referenced from the pickle memo after.
class FramesWriter {
 public:
  void Write(PickleWriter& w, const Origin& o) {
    const Key key =
        o ? Key{o->step, (uint64_t{1} << 40) | (static_cast<uint64_t>(o->phase) << 32) |
                             (static_cast<uint64_t>(o->module) << 16) | o->op}
          : Key{0, 0};
    auto it = memo_.find(key);
    if (it != memo_.end()) {
      w.Recall(it->second);
      return;
    }
    w.BeginList();
    if (o) {
      w.BeginDict();
      w.Key("filename");
      w.Str(FrameModule(o->module));
      w.Key("line");
      w.Int(0);
      w.Key("name");
      w.Str(FrameOp(o->op));
      w.EndDict();
      w.BeginDict();
      w.Key("filename");
      w.InternedStr("memprofd");
      w.Key("line");
      w.Int(o->step);
      w.Key("name");
      w.Str(absl::StrCat(PhaseName(o->phase), " step ", o->step));
      w.EndDict();
    }
    w.EndList();
    memo_.emplace(key, w.Remember());
  }

 private:
  using Key = std::pair<int64_t, uint64_t>;
  absl::flat_hash_map<Key, int64_t> memo_;
};

const char* CategoryOf(const Origin& o) {
  // CategoryName returns views of string literals.
  return o ? CategoryName(o->category).data() : "unknown";
}

void WriteTraceEntry(PickleWriter& w, FramesWriter& frames, const char* action,
                     uint64_t addr, int64_t size, int64_t time_us, const Origin& origin,
                     const char* category) {
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
  w.Key("category");
  w.InternedStr(category);
  w.EndDict();
}

void WriteSegment(PickleWriter& w, FramesWriter& frames, int device, uint64_t address,
                  int64_t total_size, int64_t stream, const std::vector<VizBlock>& blocks,
                  const std::vector<uint64_t>& block_addrs) {
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
    frames.Write(w, b.origin);
    if (b.origin && b.state == VizBlockState::kActiveAllocated) {
      // MemoryViz.js shows a block's frames only from its "history" (it
      // resets "frames"), as PyTorch's older snapshots wrote them.
      w.Key("history");
      w.BeginList();
      w.BeginDict();
      w.Key("frames");
      frames.Write(w, b.origin);
      w.Key("real_size");
      w.Int(b.requested_size);
      w.EndDict();
      w.EndList();
    }
    w.EndDict();
  }
  w.EndList();
  w.EndDict();
}

struct LiveInfo {
  int64_t size = 0;
  Origin origin;
};

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

  // The live CPU set, made consistent with the trace, and each alloc's final
  // category: that of its free, or of the live block.
  std::map<uint64_t, LiveInfo> live;
  for (const LiveBlock& b : in.live_blocks) {
    if (b.device == kCpuDevice) live[b.addr] = LiveInfo{b.size, b.origin};
  }
  const std::map<uint64_t, LiveInfo> now = live;
  std::vector<Category> final_category(in.history.size());
  absl::flat_hash_map<std::pair<int, uint64_t>, size_t> open_alloc;
  for (size_t i = 0; i < in.history.size(); ++i) {
    const HistoryEntry& e = in.history[i];
    final_category[i] = e.category;
    const std::pair<int, uint64_t> key(e.device, e.addr);
    if (e.action == HistoryAction::kAlloc) {
      open_alloc[key] = i;
    } else if (auto it = open_alloc.find(key); it != open_alloc.end()) {
      final_category[it->second] = e.category;
      open_alloc.erase(it);
    }
  }
  for (const auto& [key, index] : open_alloc) {
    if (key.first != kCpuDevice) continue;
    auto it = now.find(key.second);
    if (it != now.end() && it->second.origin) {
      final_category[index] = it->second.origin->category;
    }
  }
  for (const HistoryEntry& e : in.history) {
    if (e.device != kCpuDevice) continue;
    if (e.action == HistoryAction::kAlloc) {
      auto it = now.find(e.addr);
      Attribution a;
      if (it != now.end() && it->second.size == e.size && it->second.origin) {
        a = *it->second.origin;  // The block's record, re-tags included.
      } else {
        a.step = e.step;
        a.phase = e.phase;
        a.module = e.module;
        a.op = e.op;
        a.category = e.category;
      }
      live[e.addr] = LiveInfo{e.size, a};
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
    WriteSegment(w, frames, s.device, s.address, s.total_size, s.stream, s.blocks, addrs);
  }
  // One segment per live CPU block, exactly its size.
  for (const auto& [addr, info] : live) {
    if (info.size <= 0) continue;
    VizBlock b{info.size, info.size, VizBlockState::kActiveAllocated, info.origin};
    WriteSegment(w, frames, cpu_viz_device, addr, info.size, 0, {b}, {addr});
  }
  w.EndList();

  w.Key("device_traces");
  w.BeginList();
  const int64_t dump_time = in.history.empty() ? 0 : in.history.back().time_us;
  for (int d = 0; d <= cpu_viz_device; ++d) {
    w.BeginList();
    bool wrote = false;
    if (d < cpu_viz_device && static_cast<size_t>(d) < in.cuda.device_traces.size()) {
      for (const VizTraceEntry& t : in.cuda.device_traces[static_cast<size_t>(d)]) {
        WriteTraceEntry(w, frames, ActionName(t.action), t.addr, t.size, t.time_us,
                        t.origin, CategoryOf(t.origin));
        wrote = true;
      }
    }
    for (size_t i = 0; i < in.history.size(); ++i) {
      const HistoryEntry& e = in.history[i];
      if (viz_device(e.device) != d) continue;
      Attribution a;
      a.step = e.step;
      a.phase = e.phase;
      a.module = e.module;
      a.op = e.op;
      a.category = final_category[i];
      const Origin origin = a;
      const char* category = CategoryName(final_category[i]).data();
      const bool cpu = e.device == kCpuDevice;
      if (e.action == HistoryAction::kAlloc) {
        if (cpu) {
          WriteTraceEntry(w, frames, "segment_alloc", e.addr, e.size, e.time_us, origin,
                          category);
        }
        WriteTraceEntry(w, frames, "alloc", e.addr, e.size, e.time_us, origin, category);
      } else {
        WriteTraceEntry(w, frames, "free_requested", e.addr, e.size, e.time_us, origin,
                        category);
        WriteTraceEntry(w, frames, "free_completed", e.addr, e.size, e.time_us, origin,
                        category);
        if (cpu) {
          WriteTraceEntry(w, frames, "segment_free", e.addr, e.size, e.time_us, origin,
                          category);
        }
      }
      wrote = true;
    }
    if (wrote) {
      WriteTraceEntry(w, frames, "snapshot", 0, 0, dump_time, Origin{}, "unknown");
    }
    w.EndList();
  }
  w.EndList();

  w.Key("allocator_settings");
  w.BeginDict();
  w.Key("device_names");
  w.BeginList();
  for (int d = 0; d < cpu_viz_device; ++d) w.Str(absl::StrCat("cuda:", d));
  w.Str("cpu");
  w.EndList();
  w.Key("history_max_entries");
  w.Int(in.history_max_entries);
  w.Key("history_entries");
  w.Int(static_cast<int64_t>(in.history.size()));
  w.Key("history_dropped");
  w.Int(in.history_dropped);
  w.Key("recording");
  w.Bool(in.recording);
  w.EndDict();
  w.EndDict();
  return w.Finish();
}

std::string CaptureMemoryVizPickle(const MemoryRecorder& recorder) {
  MemoryVizInput in;
  in.live_blocks = LiveCpuBlocks();
  HistorySnapshot history = recorder.History();
  in.history = std::move(history.entries);
  in.history_max_entries = history.max_entries;
  in.history_dropped = history.dropped;
  in.recording = history.recording;
#ifdef MEMPROFD_WITH_CUDA
  in.cuda = CaptureCudaSnapshot();
  in.num_cuda_devices = CudaDeviceCount();
#endif
  return BuildMemoryVizPickle(in);
}

}  // namespace memory
}  // namespace memprofd
