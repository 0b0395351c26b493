#ifndef MEMPROFD_CORE_COMMON_TORCH_BOUNDARY_H_
#define MEMPROFD_CORE_COMMON_TORCH_BOUNDARY_H_

// The one place per library boundary where LibTorch's exceptions become
// absl::Status. Inside core/, code that calls LibTorch runs its work through
// TorchBoundary and returns the status.

#include <exception>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace memprofd {

// Runs `fn` and returns OK, or the exception it threw as a status:
// - out of memory (a c10::Error saying "can't allocate memory" or
//   "out of memory", std::bad_alloc, c10::OutOfMemoryError on 2.x):
//   RESOURCE_EXHAUSTED;
// - a full disk (a c10::Error saying "No space left on device", or carrying
//   a RESOURCE_EXHAUSTED status's text, as the offloader's spill file does):
//   RESOURCE_EXHAUSTED with the message as it is;
// - other c10::Error and std::exception: INTERNAL;
// The message is prefixed with `what` ("forward pass") and truncated to
// 1024 bytes. Thread-safe.
absl::Status TorchBoundary(absl::string_view what, absl::FunctionRef<void()> fn);

// Converts a caught exception the same way. For catch (...) blocks.
absl::Status StatusFromException(absl::string_view what, std::exception_ptr e);

// True when `message` is LibTorch's wording for an allocation failure.
bool IsOutOfMemoryMessage(absl::string_view message);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_TORCH_BOUNDARY_H_
