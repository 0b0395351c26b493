// The offloader with a CUDA compute device: pinned host copies on a side
// stream, spill-over to disk past the host limit, one copy in flight at most,
// and unpacks on a stream other than the default one. Every test skips on a
// machine without CUDA (or a build without its code paths); the Llama and
// read-ahead CUDA tests live beside their CPU versions.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#ifdef MEMPROFD_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "core/offload/offloader.h"
#include "offload_test_util.h"

namespace memprofd::offload {
namespace {

using ::memprofd::offload::testing::MakeOffloader;

constexpr int64_t kWidth = 256;  // one saved activation: 64 x 256 floats, 64 KiB

struct MlpRun {
  std::vector<at::Tensor> grads;
  OffloadStats stats;
  int64_t resident_after_forward = 0;  // copies out finished
  int64_t host_after_forward = 0;
  int64_t disk_after_forward = 0;
};

// Four Linear + ReLU layers on CUDA; `offloader` null = no offloading.
MlpRun RunMlp(Offloader* offloader) {
  const c10::Device cuda(c10::kCUDA, 0);
  torch::manual_seed(3);
  torch::nn::Sequential mlp(torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(),
                            torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(),
                            torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(),
                            torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU());
  mlp->to(cuda);
  const at::Tensor x = torch::randn({64, kWidth}).to(cuda);
  MlpRun run;
  if (offloader != nullptr) offloader->BeginStep(mlp->parameters());
  at::Tensor loss;
  {
    OffloadScope scope(offloader);
    loss = mlp->forward(x * 2).pow(2).sum();
  }
  if (offloader != nullptr) {
    offloader->Flush();
    run.resident_after_forward = offloader->resident_saved_bytes();
    run.host_after_forward = offloader->host_bytes_held();
    run.disk_after_forward = offloader->disk_bytes_held();
  }
  loss.backward();
  for (const at::Tensor& p : mlp->parameters()) run.grads.push_back(p.grad().cpu());
  if (offloader != nullptr) run.stats = offloader->EndStep();
  return run;
}

// An offloader on CUDA with `options`; null (and a failure) if it cannot be.
std::unique_ptr<Offloader> CreateOnCuda(const OffloadOptions& options) {
  auto offloader = Offloader::Create(options, c10::Device(c10::kCUDA, 0));
  EXPECT_TRUE(offloader.ok()) << offloader.status();
  return offloader.ok() ? std::move(offloader).value() : nullptr;
}

void ExpectSameGradients(const MlpRun& run, const MlpRun& reference) {
  ASSERT_EQ(run.grads.size(), reference.grads.size());
  for (size_t i = 0; i < run.grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(run.grads[i], reference.grads[i])) << "parameter " << i;
  }
}

TEST(OffloadCudaTest, HostAndDiskTargetsAreBitIdenticalAndGiveEverythingBack) {
  MEMPROFD_SKIP_WITHOUT_CUDA();
  const MlpRun reference = RunMlp(nullptr);
  auto accounting =
      MakeOffloader(Target::kHost, 1024, /*enabled=*/false, c10::Device(c10::kCUDA, 0));
  const MlpRun kept = RunMlp(accounting.get());
  EXPECT_GT(kept.resident_after_forward, 4 * 64 * kWidth * 4);
  for (const Target target : {Target::kHost, Target::kDisk}) {
    SCOPED_TRACE(TargetName(target));
    auto offloader =
        MakeOffloader(target, 1024, /*enabled=*/true, c10::Device(c10::kCUDA, 0));
    ASSERT_NE(offloader, nullptr);
    const MlpRun run = RunMlp(offloader.get());
    ExpectSameGradients(run, reference);
    EXPECT_GT(run.stats.tensors_offloaded, 0);
    EXPECT_EQ(run.stats.bytes_in, run.stats.bytes_out);
    // Off the device once the copies finished, held where the target says.
    EXPECT_LE(run.resident_after_forward, kept.resident_after_forward * 3 / 10);
    if (target == Target::kHost) {
      EXPECT_EQ(run.host_after_forward, run.stats.bytes_out);
      EXPECT_EQ(run.disk_after_forward, 0);
    } else {
      EXPECT_EQ(run.disk_after_forward, run.stats.bytes_out);
      EXPECT_EQ(run.host_after_forward, 0);
    }
    EXPECT_EQ(offloader->host_bytes_held(), 0);
    EXPECT_EQ(offloader->disk_bytes_held(), 0);
    EXPECT_EQ(offloader->resident_saved_bytes(), 0);
  }
}

TEST(OffloadCudaTest, HostLimitSpillsTheRestToDisk) {
  MEMPROFD_SKIP_WITHOUT_CUDA();
  const MlpRun reference = RunMlp(nullptr);
  OffloadOptions options;
  options.enabled = true;
  options.target = Target::kHost;
  options.host_limit_bytes = 2 * 64 * kWidth * 4;  // two activations
  auto offloader = CreateOnCuda(options);
  ASSERT_NE(offloader, nullptr);
  const MlpRun run = RunMlp(offloader.get());
  ExpectSameGradients(run, reference);
  EXPECT_LE(run.host_after_forward, options.host_limit_bytes);
  EXPECT_GT(run.host_after_forward, 0);
  EXPECT_GT(run.disk_after_forward, 0);
  EXPECT_EQ(run.host_after_forward + run.disk_after_forward, run.stats.bytes_out);
}

TEST(OffloadCudaTest, OneCopyInFlightStillMatches) {
  MEMPROFD_SKIP_WITHOUT_CUDA();
  const MlpRun reference = RunMlp(nullptr);
  OffloadOptions options;
  options.enabled = true;
  options.target = Target::kHost;
  options.max_copies_in_flight = 1;
  auto offloader = CreateOnCuda(options);
  ASSERT_NE(offloader, nullptr);
  const MlpRun run = RunMlp(offloader.get());
  ExpectSameGradients(run, reference);
  EXPECT_GT(run.stats.tensors_offloaded, 0);
}

TEST(OffloadCudaTest, ForwardAndBackwardOnASideStream) {
  MEMPROFD_SKIP_WITHOUT_CUDA();
#ifdef MEMPROFD_WITH_CUDA
  // Autograd runs backward nodes on the stream their forward ran on: here a
  // pool stream, so unpacks must order the copies back before that stream's
  // work, not the default stream's.
  const MlpRun reference = RunMlp(nullptr);
  for (const Target target : {Target::kHost, Target::kDisk}) {
    SCOPED_TRACE(TargetName(target));
    auto offloader =
        MakeOffloader(target, 1024, /*enabled=*/true, c10::Device(c10::kCUDA, 0));
    ASSERT_NE(offloader, nullptr);
    MlpRun run;
    {
      c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool(false, 0));
      run = RunMlp(offloader.get());
    }
    ExpectSameGradients(run, reference);
    EXPECT_GT(run.stats.bytes_in, 0);
  }
#endif
}

}  // namespace
}  // namespace memprofd::offload
