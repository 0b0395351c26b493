#ifndef MEMPROFD_CORE_MEMORY_INSTALL_H_
#define MEMPROFD_CORE_MEMORY_INSTALL_H_

// One call that turns memory accounting on for the process.

#include "absl/status/status.h"

namespace memprofd {
namespace memory {

// Installs the counting CPU allocator (InstallCountingCpuAllocator()) and
// registers MemoryRecorder::Global() as the process's PhaseListener. Call
// once at process start, before any model tensor exists and before training
// starts. Idempotent. Returns the allocator installation's status.
absl::Status InstallMemoryAccounting();

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_INSTALL_H_
