#include "tests/testing/cuda.h"

#include <ATen/Context.h>
#include <torch/cuda.h>

namespace memprofd {
namespace testing {

bool HasCuda() {
#ifdef MEMPROFD_WITH_CUDA
  static const bool has_cuda = [] {
    if (!torch::cuda::is_available()) return false;
    // CUDA's lazy init before the first backward, as the daemon's Runtime
    // does: LibTorch 2.11's autograd engine sizes its device queues once, at
    // the process's first backward, and a CUDA backward in a process where
    // CUDA was never initialised fails its ready-queue assertion (seen on an
    // H200: offload_test's first CUDA backward).
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    return true;
  }();
  return has_cuda;
#else
  return false;
#endif
}

}  // namespace testing
}  // namespace memprofd
