#ifndef MEMPROFD_CORE_OFFLOAD_INTERNAL_ENGINE_H_
#define MEMPROFD_CORE_OFFLOAD_INTERNAL_ENGINE_H_

#include "absl/status/status.h"

namespace memprofd::offload::internal {

class OffloadCore;

// The scope in force on this thread. Pack hooks are created on the thread
// that runs forward, so a thread-local is the right home for it; unpack runs
// on autograd threads and reaches its offloader through the hooks object,
// never through this.
struct ThreadScope {
  OffloadCore* core = nullptr;  // innermost OffloadScope's offloader
  bool exempt = false;          // inside a NoOffloadScope
};
ThreadScope& CurrentThreadScope();

// Installs the offloading autograd engine as LibTorch's default (once).
absl::Status InstallEngine();

}  // namespace memprofd::offload::internal

#endif  // MEMPROFD_CORE_OFFLOAD_INTERNAL_ENGINE_H_
