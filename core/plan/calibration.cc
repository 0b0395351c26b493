#include "core/plan/calibration.h"

#include "core/memory/cpu_allocator.h"
#include "core/memory/recorder.h"
#ifdef MEMPROFD_WITH_CUDA
#include "core/memory/cuda_stats.h"
#endif
#include "core/plan/step_runner.h"

namespace memprofd::plan {

absl::StatusOr<std::vector<MeasuredStep>> MeasureTrainingSteps(const PlanSpec& spec,
                                                               c10::Device device) {
  if (!memory::IsCountingCpuAllocatorInstalled()) {
    return absl::FailedPreconditionError(
        "calibration: the process's memory accounting is not installed "
        "(memory::InstallMemoryAccounting)");
  }
  memory::MemoryRecorder& recorder = memory::MemoryRecorder::Global();
  const int index =
      device.is_cuda() ? device.index() < 0 ? 0 : device.index() : memory::kCpuDevice;
  const int64_t before_model = recorder.CurrentBytes(index);
  std::vector<MeasuredStep> steps;
  absl::Status run = internal::RunPlannedSteps(
      spec, device, /*prepare_model=*/{},
      [&](int64_t) {
#ifdef MEMPROFD_WITH_CUDA
        // The caching allocator's own peak too, or the first boundary's fold
        // would bring the model's creation into the step.
        if (device.is_cuda()) memory::ResetCudaPeaks();
#endif
        recorder.ResetPeak();
      },
      [&](int64_t step, const offload::OffloadStats&) {
        steps.push_back({step, recorder.PeakBytes(index) - before_model});
      });
  if (!run.ok()) return run;
  return steps;
}

}  // namespace memprofd::plan
