#include "core/memory/install.h"

#include "core/common/phase.h"
#include "core/memory/cpu_allocator.h"
#include "core/memory/recorder.h"

namespace memprofd {
namespace memory {

absl::Status InstallMemoryAccounting() {
  absl::Status status = InstallCountingCpuAllocator();
  SetPhaseListener(&MemoryRecorder::Global());
  return status;
}

}  // namespace memory
}  // namespace memprofd
