#ifndef MEMPROFD_TESTS_TESTING_CUDA_H_
#define MEMPROFD_TESTS_TESTING_CUDA_H_

// Whether a test can use CUDA. CUDA code paths compile wherever LibTorch has
// CUDA, but their tests run only on a GPU host (deploy/gpu-run.sh); elsewhere
// they skip and say why:
//   if (!testing::HasCuda()) GTEST_SKIP() << testing::kNeedsCuda;
// Thread-safe.

namespace memprofd {
namespace testing {

// True when this build has the CUDA code paths (MEMPROFD_WITH_CUDA) and
// LibTorch sees a CUDA device; CUDA is then initialised (once per process),
// so that the test's CUDA work, backward included, runs as in the daemon.
bool HasCuda();

inline constexpr char kNeedsCuda[] =
    "needs a CUDA device and a build with CUDA code paths (MEMPROFD_WITH_CUDA)";

}  // namespace testing
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_TESTING_CUDA_H_
