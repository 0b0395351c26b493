#include "tests/testing/cuda.h"

#include <torch/cuda.h>

namespace memprofd {
namespace testing {

bool HasCuda() {
#ifdef MEMPROFD_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

}  // namespace testing
}  // namespace memprofd
