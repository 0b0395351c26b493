#include "core/plan/calibration.h"

#include "core/memory/cpu_allocator.h"
#include "core/memory/recorder.h"
#ifdef MEMPROFD_WITH_CUDA
#include "core/memory/cuda_stats.h"
#endif
#include "core/plan/step_runner.h"

namespace memprofd::plan {

absl::StatusOr<std::vector<MeasuredStep>> MeasureTrainingSteps(
    const PlanSpec& spec, c10::Device device, memory::MemoryRecorder& recorder,
    ProcessGroup* group) {
  if (!memory::IsCountingCpuAllocatorInstalled()) {
    return absl::FailedPreconditionError(
        "calibration: the process's memory accounting is not installed "
        "(memory::InstallMemoryAccounting)");
  }
  const int index =
      device.is_cuda() ? device.index() < 0 ? 0 : device.index() : memory::kCpuDevice;
  // The bytes held before the model exists. The recorder's CUDA figures are
  // folded from the caching allocator at step and phase boundaries only, so
  // on CUDA they are sampled now (a previous model's bytes may still be the
  // recorder's last fold).
  int64_t before_model = recorder.CurrentBytes(index);
  int64_t reserved_before_model = 0;
  auto sample_reserved = [&](bool peak) -> int64_t {
#ifdef MEMPROFD_WITH_CUDA
    for (const memory::CudaDeviceSample& s : memory::SampleCudaDevices()) {
      if (s.device == index) return peak ? s.peak_reserved_bytes : s.reserved_bytes;
    }
#endif
    (void)peak;
    return 0;
  };
#ifdef MEMPROFD_WITH_CUDA
  if (device.is_cuda()) {
    // An earlier run's cached segments would serve this one's blocks.
    memory::EmptyCudaCache();
    for (const memory::CudaDeviceSample& s : memory::SampleCudaDevices()) {
      if (s.device == index) before_model = s.allocated_bytes;
    }
    reserved_before_model = sample_reserved(false);
  }
#endif
  std::vector<MeasuredStep> steps;
  absl::Status run = internal::RunPlannedSteps(
      spec, device, group, /*prepare_model=*/{},
      [&](int64_t) {
#ifdef MEMPROFD_WITH_CUDA
        // The caching allocator's own peak too, or the first boundary's fold
        // would bring the model's creation into the step. (Its reserve never
        // shrinks, so the reserved peak still covers the model's creation.)
        if (device.is_cuda()) memory::ResetCudaPeaks();
#endif
        recorder.ResetPeak();
      },
      [&](int64_t step, const offload::OffloadStats&) {
        const int64_t reserved =
            device.is_cuda() ? sample_reserved(true) - reserved_before_model : 0;
        steps.push_back({step, recorder.PeakBytes(index) - before_model, reserved});
      });
  if (!run.ok()) return run;
  return steps;
}

}  // namespace memprofd::plan
