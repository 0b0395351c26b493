#ifndef MEMPROFD_CORE_PLAN_META_KERNELS_H_
#define MEMPROFD_CORE_PLAN_META_KERNELS_H_

// Shape-only Meta kernels for the aten ops a Llama training step calls that
// LibTorch 2.11 ships without a C++ Meta kernel (Python registers them in
// torch/_meta_registrations.py, which a C++ process never loads). With them,
// one step (forward, loss, backward, fused AdamW) runs on the meta device, so
// that a planner can count every allocation the step makes without doing it.

#include "absl/status/status.h"

namespace memprofd::plan {

// Ensures the kernels are registered with the dispatcher (they are, at static
// initialization of this library; calling this also keeps the linker from
// dropping them). Idempotent and thread-safe. INTERNAL, naming the op, when
// an op still has no Meta kernel (a LibTorch whose schemas differ: rebuild
// against the LibTorch the kernels were written for).
absl::Status RegisterMetaKernels();

}  // namespace memprofd::plan

#endif  // MEMPROFD_CORE_PLAN_META_KERNELS_H_
