#ifndef MEMPROFD_CORE_MEMORY_BREAKDOWN_H_
#define MEMPROFD_CORE_MEMORY_BREAKDOWN_H_

// Where the bytes are, from the attribution every allocation carries
// (core/common/attribution.h): live bytes now and the last step's peaks by
// module x category x phase, bytes allocated per op, the difference between
// two recent steps, and the largest live blocks. Everything is read from the
// recorder's cells and the allocator's live-block records; nothing is
// inferred. No LibTorch.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/common/attribution.h"
#include "core/common/phase.h"
#include "core/memory/recorder.h"

namespace memprofd {
namespace memory {

enum class BreakdownKey { kModule, kOp, kCategory };

// A validated breakdown request (see ParseBreakdownQuery).
struct BreakdownQuery {
  BreakdownKey by = BreakdownKey::kModule;
  std::optional<Phase> phase;  // Peaks in this phase only; unset: any phase.
  int64_t top = 20;
  int device = kCpuDevice;
};

// What a caller may leave unset.
struct BreakdownRequest {
  std::optional<std::string> by;     // "module" (default), "op", "category"
  std::optional<std::string> phase;  // a PhaseName ("forward", "backward", ...)
  std::optional<int64_t> top;        // 1..kMaxTop, default kDefaultTop
};
inline constexpr int64_t kDefaultTop = 20;
inline constexpr int64_t kMaxTop = 10000;

// INVALID_ARGUMENT naming the field and what it accepts.
absl::StatusOr<BreakdownQuery> ParseBreakdownQuery(const BreakdownRequest& request,
                                                   int device);

struct BreakdownRow {
  // By module: the module path ("" for none) and the category; by op: the
  // op name; by category: the category name (category == key).
  std::string key;
  Category category = Category::kUnknown;
  int64_t live_bytes = 0;  // Now (0 for op rows).
  // The last finished step's high-water mark: in the query's phase, or the
  // largest over its phases (peak_phase says which).
  int64_t peak_bytes = 0;
  Phase peak_phase = Phase::kIdle;
  // By op: bytes allocated in the last finished step, and since start.
  int64_t allocated_bytes = 0;
  int64_t allocated_bytes_total = 0;
};

struct MemoryBreakdown {
  std::string device;
  int64_t step = 0;  // The last finished step (0: none yet).
  BreakdownKey by = BreakdownKey::kModule;
  std::optional<Phase> phase;
  std::vector<BreakdownRow> rows;  // The top rows, largest peak (then live) first.
  int64_t total_rows = 0;          // Before the top cut.
  // Live bytes per category now, every category in Category order; they sum
  // to attributed_bytes.
  std::vector<std::pair<Category, int64_t>> categories;
  int64_t attributed_bytes = 0;
  // The allocator's current bytes, read just after: on CUDA the requested
  // bytes of its blocks (which the cells count), not their rounded sizes.
  int64_t allocator_bytes = 0;
  // Bytes allocated per op in the last step, largest first, top rows.
  std::vector<BreakdownRow> ops;
  // Outside the allocator (filled by the session from the offloader).
  int64_t offloaded_host_bytes = 0;
  int64_t offloaded_disk_bytes = 0;
};

MemoryBreakdown ComputeBreakdown(const MemoryRecorder& recorder,
                                 const BreakdownQuery& query);

// What grew between steps a and b, by (module, category).
struct DiffRow {
  std::string module;
  Category category = Category::kUnknown;
  int64_t peak_a = 0;  // Largest over the step's phases.
  int64_t peak_b = 0;
  int64_t live_a = 0;  // When the step ended.
  int64_t live_b = 0;
};
struct MemoryDiff {
  std::string device;
  int64_t step_a = 0;
  int64_t step_b = 0;
  std::vector<DiffRow> rows;  // Largest |peak_b - peak_a| first (then |live|), top rows.
  // The same by category alone (module empty), every category that changed.
  std::vector<DiffRow> categories;
  std::vector<int64_t> steps_kept;  // The steps a diff can name now, oldest first.
};

// NOT_FOUND when a step is not among the last MemoryRecorder::kStepRecords
// finished steps (the message lists those kept); INVALID_ARGUMENT for a step
// < 1 or a top outside 1..kMaxTop.
absl::StatusOr<MemoryDiff> ComputeDiff(const MemoryRecorder& recorder, int64_t step_a,
                                       int64_t step_b, std::optional<int64_t> top,
                                       int device);

// One live allocation with its attribution.
struct AttributedBlock {
  int device = kCpuDevice;
  uint64_t addr = 0;
  int64_t size = 0;
  std::string module;
  std::string op;
  Category category = Category::kUnknown;
  Phase phase = Phase::kIdle;
  int64_t step = 0;
};

// The `n` largest allocations alive now that the counting CPU allocator
// made or, once attached, the CUDA accounting saw (cuda_stats.h), largest
// first. O(live blocks); takes each shard's lock in turn; thread-safe.
// Allocates its result and a copy of the live-block list.
std::vector<AttributedBlock> LargestLiveBlocks(int64_t n);

// Live bytes on `device` now by module kind (ModuleKindOf the module path)
// and category: [kind][category]. For bounded-cardinality metrics.
using ModuleKindBytes = std::array<std::array<int64_t, kNumCategories>, kNumModuleKinds>;
ModuleKindBytes LiveBytesByModuleKind(const MemoryRecorder& recorder, int device);

// "module", "op", "category".
absl::string_view BreakdownKeyName(BreakdownKey key);

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_BREAKDOWN_H_
