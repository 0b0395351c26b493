#include "core/memory/breakdown.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <queue>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/utf8.h"
#include "core/memory/cpu_allocator.h"
#ifdef MEMPROFD_WITH_CUDA
#include "core/memory/cuda_stats.h"
#endif

namespace memprofd {
namespace memory {
namespace {

// Orders rows largest peak first, then largest live, then by name.
bool Larger(const BreakdownRow& a, const BreakdownRow& b) {
  return std::tie(b.peak_bytes, b.live_bytes, b.allocated_bytes, a.key) <
         std::tie(a.peak_bytes, a.live_bytes, a.allocated_bytes, b.key);
}

void Cut(std::vector<BreakdownRow>& rows, int64_t top) {
  std::sort(rows.begin(), rows.end(), Larger);
  if (static_cast<int64_t>(rows.size()) > top) rows.resize(static_cast<size_t>(top));
}

const StepAttribution* Find(const std::vector<StepAttribution>& records, int64_t step) {
  for (const StepAttribution& r : records) {
    if (r.step == step) return &r;
  }
  return nullptr;
}

// Peak of a (module, category) cell in `phase` (any phase when unset) and
// the phase it was reached in.
struct Peak {
  int64_t bytes = 0;
  Phase phase = Phase::kIdle;
};
void Raise(Peak& p, int64_t bytes, Phase phase) {
  if (bytes > p.bytes) p = Peak{bytes, phase};
}

}  // namespace

absl::string_view BreakdownKeyName(BreakdownKey key) {
  switch (key) {
    case BreakdownKey::kModule:
      return "module";
    case BreakdownKey::kOp:
      return "op";
    case BreakdownKey::kCategory:
      return "category";
  }
  return "module";
}

absl::StatusOr<BreakdownQuery> ParseBreakdownQuery(const BreakdownRequest& request,
                                                   int device) {
  BreakdownQuery q;
  q.device = device;
  if (request.by) {
    if (*request.by == "module") {
      q.by = BreakdownKey::kModule;
    } else if (*request.by == "op") {
      q.by = BreakdownKey::kOp;
    } else if (*request.by == "category") {
      q.by = BreakdownKey::kCategory;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "by must be \"module\", \"op\" or \"category\", got ", Echo(*request.by)));
    }
  }
  if (request.phase && !request.phase->empty()) {
    bool found = false;
    std::vector<std::string> names;
    for (int p = 0; p < kNumPhases; ++p) {
      const Phase phase = static_cast<Phase>(p);
      names.emplace_back(PhaseName(phase));
      if (PhaseName(phase) == *request.phase) {
        q.phase = phase;
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat("phase must be one of ",
                                                     absl::StrJoin(names, ", "), ", got ",
                                                     Echo(*request.phase)));
    }
  }
  q.top = request.top.value_or(kDefaultTop);
  if (q.top < 1 || q.top > kMaxTop) {
    return absl::InvalidArgumentError(
        absl::StrCat("top must be in [1, ", kMaxTop, "], got ", q.top));
  }
  return q;
}

MemoryBreakdown ComputeBreakdown(const MemoryRecorder& recorder,
                                 const BreakdownQuery& q) {
  MemoryBreakdown out;
  out.device = DeviceName(q.device);
  out.by = q.by;
  out.phase = q.phase;
  const std::vector<StepAttribution> records = recorder.StepRecords();
  const StepAttribution* last = records.empty() ? nullptr : &records.back();
  out.step = last ? last->step : 0;
  auto in_query = [&](int device, Phase phase) {
    return device == q.device && (!q.phase || *q.phase == phase);
  };

  const std::array<int64_t, kNumCategories> categories =
      recorder.CategoryBytesOf(q.device);
  for (int k = 0; k < kNumCategories; ++k) {
    out.categories.emplace_back(static_cast<Category>(k),
                                categories[static_cast<size_t>(k)]);
    out.attributed_bytes += categories[static_cast<size_t>(k)];
  }
  out.allocator_bytes = recorder.CurrentBytes(q.device);
#ifdef MEMPROFD_WITH_CUDA
  if (q.device != kCpuDevice) {
    // The cells hold requested sizes (cuda_stats.h); the allocator's
    // requested bytes are what they add up to, read now (the recorder's
    // CUDA totals are folded in at phase boundaries).
    out.allocator_bytes = 0;
    for (const CudaDeviceSample& s : SampleCudaDevices()) {
      if (s.device == q.device) out.allocator_bytes = s.requested_bytes;
    }
  }
#endif

  std::vector<BreakdownRow> rows;
  if (q.by == BreakdownKey::kModule) {
    std::map<std::pair<ModuleId, Category>, std::pair<int64_t, Peak>> cells;
    for (const CellBytes& c : recorder.LiveCells()) {
      if (c.device == q.device) cells[{c.module, c.category}].first += c.bytes;
    }
    if (last) {
      for (const CellPhasePeak& p : last->phase_peaks) {
        if (in_query(p.device, p.phase)) {
          Raise(cells[{p.module, p.category}].second, p.peak_bytes, p.phase);
        }
      }
    }
    for (const auto& [key, value] : cells) {
      BreakdownRow r;
      r.key = ModuleName(key.first);
      r.category = key.second;
      r.live_bytes = value.first;
      r.peak_bytes = value.second.bytes;
      r.peak_phase = value.second.phase;
      if (r.live_bytes != 0 || r.peak_bytes != 0) rows.push_back(std::move(r));
    }
  } else if (q.by == BreakdownKey::kCategory) {
    std::array<Peak, kNumCategories> peaks{};
    if (last) {
      for (const CellPhasePeak& p : last->category_phase_peaks) {
        if (in_query(p.device, p.phase)) {
          Raise(peaks[static_cast<size_t>(p.category)], p.peak_bytes, p.phase);
        }
      }
    }
    for (int k = 0; k < kNumCategories; ++k) {
      BreakdownRow r;
      r.category = static_cast<Category>(k);
      r.key = std::string(CategoryName(r.category));
      r.live_bytes = categories[static_cast<size_t>(k)];
      r.peak_bytes = peaks[static_cast<size_t>(k)].bytes;
      r.peak_phase = peaks[static_cast<size_t>(k)].phase;
      if (r.live_bytes != 0 || r.peak_bytes != 0) rows.push_back(std::move(r));
    }
  }
  std::vector<BreakdownRow> ops;
  {
    std::map<OpId, BreakdownRow> by_op;
    if (last) {
      for (const OpBytes& o : last->op_bytes) {
        if (o.device == q.device) by_op[o.op].allocated_bytes += o.bytes;
      }
    }
    for (const OpBytes& o : recorder.OpBytesTotal()) {
      if (o.device == q.device) by_op[o.op].allocated_bytes_total += o.bytes;
    }
    for (auto& [op, row] : by_op) {
      row.key = OpName(op);
      if (row.key.empty()) row.key = "(no op)";
      if (row.allocated_bytes != 0 || row.allocated_bytes_total != 0) {
        ops.push_back(std::move(row));
      }
    }
    std::sort(ops.begin(), ops.end(), [](const BreakdownRow& a, const BreakdownRow& b) {
      return std::tie(b.allocated_bytes, b.allocated_bytes_total, a.key) <
             std::tie(a.allocated_bytes, a.allocated_bytes_total, b.key);
    });
  }
  if (q.by == BreakdownKey::kOp) rows = ops;
  out.total_rows = static_cast<int64_t>(rows.size());
  if (q.by != BreakdownKey::kOp) Cut(rows, q.top);
  if (static_cast<int64_t>(rows.size()) > q.top) rows.resize(static_cast<size_t>(q.top));
  if (static_cast<int64_t>(ops.size()) > q.top) ops.resize(static_cast<size_t>(q.top));
  out.rows = std::move(rows);
  out.ops = std::move(ops);
  return out;
}

absl::StatusOr<MemoryDiff> ComputeDiff(const MemoryRecorder& recorder, int64_t step_a,
                                       int64_t step_b, std::optional<int64_t> top,
                                       int device) {
  if (step_a < 1 || step_b < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "steps must be >= 1 (global step numbers), got ", step_a, " and ", step_b));
  }
  const int64_t n = top.value_or(kDefaultTop);
  if (n < 1 || n > kMaxTop) {
    return absl::InvalidArgumentError(
        absl::StrCat("top must be in [1, ", kMaxTop, "], got ", n));
  }
  const std::vector<StepAttribution> records = recorder.StepRecords();
  MemoryDiff out;
  out.device = DeviceName(device);
  out.step_a = step_a;
  out.step_b = step_b;
  for (const StepAttribution& r : records) out.steps_kept.push_back(r.step);
  const StepAttribution* a = Find(records, step_a);
  const StepAttribution* b = Find(records, step_b);
  if (a == nullptr || b == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("step ", a == nullptr ? step_a : step_b, " is not among the last ",
                     MemoryRecorder::kStepRecords, " finished steps, which are kept: ",
                     out.steps_kept.empty() ? std::string("none (train first)")
                                            : absl::StrJoin(out.steps_kept, ", ")));
  }
  std::map<std::pair<ModuleId, Category>, DiffRow> cells;
  std::array<DiffRow, kNumCategories> by_category{};
  auto fold = [&](const StepAttribution& r, bool is_b) {
    for (const CellPhasePeak& p : r.phase_peaks) {
      if (p.device != device) continue;
      DiffRow& row = cells[{p.module, p.category}];
      int64_t& peak = is_b ? row.peak_b : row.peak_a;
      peak = std::max(peak, p.peak_bytes);
    }
    for (const CellPhasePeak& p : r.category_phase_peaks) {
      if (p.device != device) continue;
      DiffRow& row = by_category[static_cast<size_t>(p.category)];
      int64_t& peak = is_b ? row.peak_b : row.peak_a;
      peak = std::max(peak, p.peak_bytes);
    }
    for (const CellBytes& c : r.live_at_end) {
      if (c.device != device) continue;
      (is_b ? cells[{c.module, c.category}].live_b
            : cells[{c.module, c.category}].live_a) += c.bytes;
      DiffRow& row = by_category[static_cast<size_t>(c.category)];
      (is_b ? row.live_b : row.live_a) += c.bytes;
    }
  };
  fold(*a, false);
  fold(*b, true);
  auto changed = [](const DiffRow& r) {
    return r.peak_a != r.peak_b || r.live_a != r.live_b;
  };
  auto larger = [](const DiffRow& x, const DiffRow& y) {
    const int64_t dx = std::llabs(x.peak_b - x.peak_a);
    const int64_t dy = std::llabs(y.peak_b - y.peak_a);
    if (dx != dy) return dx > dy;
    const int64_t lx = std::llabs(x.live_b - x.live_a);
    const int64_t ly = std::llabs(y.live_b - y.live_a);
    if (lx != ly) return lx > ly;
    return std::tie(x.module, x.category) < std::tie(y.module, y.category);
  };
  for (auto& [key, row] : cells) {
    row.module = ModuleName(key.first);
    row.category = key.second;
    if (changed(row)) out.rows.push_back(row);
  }
  std::sort(out.rows.begin(), out.rows.end(), larger);
  if (static_cast<int64_t>(out.rows.size()) > n) out.rows.resize(static_cast<size_t>(n));
  for (int k = 0; k < kNumCategories; ++k) {
    DiffRow row = by_category[static_cast<size_t>(k)];
    row.category = static_cast<Category>(k);
    if (changed(row)) out.categories.push_back(row);
  }
  std::sort(out.categories.begin(), out.categories.end(), larger);
  return out;
}

ModuleKindBytes LiveBytesByModuleKind(const MemoryRecorder& recorder, int device) {
  ModuleKindBytes out{};
  std::map<ModuleId, ModuleKind> kinds;
  for (const CellBytes& c : recorder.LiveCells()) {
    if (c.device != device) continue;
    auto it = kinds.find(c.module);
    if (it == kinds.end())
      it = kinds.emplace(c.module, ModuleKindOf(ModuleName(c.module))).first;
    out[static_cast<size_t>(it->second)][static_cast<size_t>(c.category)] += c.bytes;
  }
  return out;
}

std::vector<AttributedBlock> LargestLiveBlocks(int64_t n) {
  std::vector<AttributedBlock> out;
  if (n <= 0) return out;
  std::vector<LiveBlock> live = LiveCpuBlocks();
#ifdef MEMPROFD_WITH_CUDA
  for (LiveBlock& b : LiveCudaBlocks()) live.push_back(b);
#endif
  const size_t keep = std::min(live.size(), static_cast<size_t>(n));
  std::partial_sort(
      live.begin(), live.begin() + static_cast<std::ptrdiff_t>(keep), live.end(),
      [](const LiveBlock& a, const LiveBlock& b) { return a.size > b.size; });
  for (size_t i = 0; i < keep; ++i) {
    const LiveBlock& b = live[i];
    AttributedBlock a;
    a.device = b.device;
    a.addr = b.addr;
    a.size = b.size;
    a.module = ModuleName(b.origin.module);
    a.op = OpName(b.origin.op);
    a.category = b.origin.category;
    a.phase = b.origin.phase;
    a.step = b.origin.step;
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace memory
}  // namespace memprofd
