#ifndef MEMPROFD_CORE_PLAN_CALIBRATION_H_
#define MEMPROFD_CORE_PLAN_CALIBRATION_H_

// The measurement a plan is judged against: the same two training steps the
// planner dry-runs (planner.h), run for real on a device, their peaks read
// from the process's recorder. For benchmarks, tests and the GPU check; the
// daemon's own steps are measured by its session.

#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dist/process_group.h"
#include "core/plan/planner.h"

namespace memprofd::memory {
class MemoryRecorder;
}  // namespace memprofd::memory

namespace memprofd::plan {

struct MeasuredStep {
  int64_t step = 0;
  // The most bytes the device's allocator held during the step, above what
  // it held before the model was made (the process's own bytes, the token
  // window).
  int64_t peak_allocated_bytes = 0;
  // On CUDA, the most bytes the caching allocator reserved from the device
  // up to the end of the step (torch.cuda.max_memory_reserved), above what
  // it reserved before the model was made, its cache emptied first; model
  // creation included, as a plan's reserved_bytes includes it. 0 on a CPU.
  int64_t peak_reserved_bytes = 0;
};

// Makes spec.model on `device` (CPU, or CUDA with the CUDA accounting
// attached) with weights from seed 0, and runs the two steps the planner
// plans, with the offloader's accounting as the planner has it, measured by
// `recorder`: the process's, which the allocator hooks report to (the
// Runtime's; a test's is the process's instance). Needs the process's
// memory accounting installed (memory::InstallMemoryAccounting;
// FAILED_PRECONDITION otherwise) and no other training in the process (the
// recorder's peaks are reset at each step). The planner's refusals apply.
// With spec.world_size > 1 the steps are rank group->rank()'s of a real
// data-parallel run over `group` (every rank calls this at once);
// INVALID_ARGUMENT without a group of that size.
absl::StatusOr<std::vector<MeasuredStep>> MeasureTrainingSteps(
    const PlanSpec& spec, c10::Device device, memory::MemoryRecorder& recorder,
    ProcessGroup* group = nullptr);

}  // namespace memprofd::plan

#endif  // MEMPROFD_CORE_PLAN_CALIBRATION_H_
