// Session: memory attribution of the loaded model (TagModelMemory), the
// categories now, and the breakdown and step-diff calls of the one door.

#include <ATen/ATen.h>

#include "core/common/attribution.h"
#include "core/common/status_macros.h"
#include "core/memory/recorder.h"
#include "core/session/runtime.h"
#include "core/session/session.h"
#include "core/train/memory_tags.h"

namespace memprofd {

int Session::RecorderDevice() const {
  const c10::Device device(device_);
  return device.is_cpu() ? memory::kCpuDevice : device.index();
}

void Session::TagModelMemory() {
  if (model_) memprofd::TagModelMemory(*model_);
}

memory::CategoryBytes Session::CategoriesNow() const {
  const std::array<int64_t, kNumCategories> b =
      runtime_.recorder().CategoryBytesOf(RecorderDevice());
  auto at = [&](Category c) { return b[static_cast<size_t>(c)]; };
  memory::CategoryBytes c;
  c.parameters = at(Category::kParameters);
  c.gradients = at(Category::kGradients);
  c.optimizer_state = at(Category::kOptimizerState);
  c.saved_activations = at(Category::kSavedActivations);
  c.temporaries = at(Category::kTemporaries);
  c.offloaded_host = at(Category::kOffloadedHost);
  c.offloaded_disk = at(Category::kOffloadedDisk);
  c.snapshot_staging = at(Category::kSnapshotStaging);
  c.other = at(Category::kOther);
  c.unknown = at(Category::kUnknown);
  c.activations_and_temporaries = c.saved_activations + c.temporaries;
  return c;
}

absl::StatusOr<memory::MemoryBreakdown> Session::MemoryBreakdown(
    const memory::BreakdownRequest& request) const {
  ASSIGN_OR_RETURN(const memory::BreakdownQuery query,
                   memory::ParseBreakdownQuery(request, RecorderDevice()));
  memory::MemoryBreakdown out =
      memory::ComputeBreakdown(runtime_.recorder(), query);
  absl::MutexLock lock(&mu_);
  out.offloaded_host_bytes = counters_.categories.offloaded_host;
  out.offloaded_disk_bytes = counters_.categories.offloaded_disk;
  return out;
}

absl::StatusOr<memory::MemoryDiff> Session::DiffMemory(int64_t step_a, int64_t step_b,
                                                       std::optional<int64_t> top) const {
  return memory::ComputeDiff(runtime_.recorder(), step_a, step_b, top,
                             RecorderDevice());
}

memory::ModuleKindBytes Session::MemoryByModuleKind() const {
  return memory::LiveBytesByModuleKind(runtime_.recorder(),
                                       RecorderDevice());
}

}  // namespace memprofd
