#include "core/session/runtime.h"

#include <c10/core/Device.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/log.h"
#include "core/memory/cpu_allocator.h"
#include "core/memory/install.h"
#include "core/memory/recorder.h"
#include "core/offload/offloader.h"
#ifdef MEMPROFD_WITH_CUDA
#include "core/memory/cuda_stats.h"
#endif

namespace memprofd {

int RecorderDeviceOf(const std::string& device) {
  const c10::Device d(device);
  return d.is_cpu() ? memory::kCpuDevice : d.index();
}

absl::StatusOr<Runtime*> Runtime::Install() {
  // Made once, by the first caller; never destroyed (tensors may be freed
  // during static destruction, and the allocator reports to the recorder).
  static const absl::StatusOr<Runtime*> runtime = []() -> absl::StatusOr<Runtime*> {
    // Before any model tensor exists: every allocation from here on is
    // counted.
    if (absl::Status s = memory::InstallMemoryAccounting(); !s.ok()) {
      LogWarning(absl::StrCat("memory accounting unavailable: ", s.message()));
    }
    if (absl::Status s = offload::InstallOffloadEngine(); !s.ok()) return s;
    return new Runtime(memory::MemoryRecorder::Global());
  }();
  return runtime;
}

absl::Status Runtime::UseDevice(const std::string& device, int64_t memory_limit_bytes) {
  const bool cuda = absl::StartsWith(device, "cuda");
  recorder_.set_track_cuda(cuda);
  if (!cuda) {
    memory::SetCpuMemoryLimit(memory_limit_bytes);
    return absl::OkStatus();
  }
#ifdef MEMPROFD_WITH_CUDA
  // The CUDA blocks' attribution, before the model loads.
  if (absl::Status s = memory::AttachCudaAccounting(); !s.ok()) {
    LogWarning(absl::StrCat("CUDA memory attribution unavailable: ", s.message()));
  }
  const int index = RecorderDeviceOf(device);
  if (memory_limit_bytes > 0 || memory::CudaMemoryLimit(index) > 0) {
    return memory::SetCudaMemoryLimit(index, memory_limit_bytes);
  }
#endif
  return absl::OkStatus();
}

}  // namespace memprofd
