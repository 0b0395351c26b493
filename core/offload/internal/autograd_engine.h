#ifndef MEMPROFD_CORE_OFFLOAD_INTERNAL_AUTOGRAD_ENGINE_H_
#define MEMPROFD_CORE_OFFLOAD_INTERNAL_AUTOGRAD_ENGINE_H_

// The autograd engine that hands saved tensors to a SavedTensorStore, and the
// per-thread scope that says which store (if any) gets them. Private to
// core/offload.

#include "absl/status/status.h"

namespace memprofd::offload::internal {

class SavedTensorStore;

// The scope in force on this thread. Pack hooks are created on the thread
// that runs forward, so a thread-local is the right home for it; unpack runs
// on autograd threads and reaches its offloader through the hooks object,
// never through this.
struct ThreadScope {
  SavedTensorStore* store = nullptr;  // the innermost OffloadScope's offloader's store
  bool exempt = false;                // inside a NoOffloadScope
};
ThreadScope& CurrentThreadScope();

// Installs the offloading autograd engine as LibTorch's default (once).
absl::Status InstallEngine();

}  // namespace memprofd::offload::internal

#endif  // MEMPROFD_CORE_OFFLOAD_INTERNAL_AUTOGRAD_ENGINE_H_
