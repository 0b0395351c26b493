// Backward read-ahead: every offloaded storage comes back exactly once, the
// ones backward needs next come back before their unpack asks, never more
// than prefetch_depth ahead, and gradients are those of a run without it.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/offload/offloader.h"
#include "offload_test_util.h"

namespace memprofd::offload {
namespace {

using ::memprofd::offload::testing::MakeOffloader;

constexpr int64_t kRows = 64;
constexpr int64_t kCols = 256;
constexpr int64_t kBytes = kRows * kCols * 4;  // one saved storage
constexpr int64_t kNodes = 8;

// What the nodes of the chain below see in backward. Backward runs on the
// test's thread (CPU), one node at a time.
struct Probe {
  Offloader* offloader = nullptr;
  bool wait_for_read_ahead = false;
  bool timed_out = false;
  std::vector<int64_t> resident;  // resident saved bytes, per node, in backward
};
Probe& TheProbe() {
  static Probe probe;
  return probe;
}

// y = sin(x), saving x (a fresh storage per node). In backward, after its own
// unpack, node `index` waits (when asked) until the read-ahead has brought
// back the storage of node index - 1, then records the resident bytes.
struct SinNode : public torch::autograd::Function<SinNode> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t index) {
    ctx->save_for_backward({x});
    ctx->saved_data["index"] = index;
    return torch::sin(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const int64_t index = ctx->saved_data["index"].toInt();
    Probe& probe = TheProbe();
    if (probe.wait_for_read_ahead && index > 0) {
      // Nodes kNodes-2 .. index-1 have been read ahead by now.
      const int64_t want = (kNodes - index) * kBytes;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (probe.offloader->Totals().bytes_prefetched < want) {
        if (std::chrono::steady_clock::now() > deadline) {
          probe.timed_out = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (probe.offloader != nullptr) {
      probe.resident.push_back(probe.offloader->resident_saved_bytes());
    }
    return {torch::cos(x) * grads[0], at::Tensor()};
  }
};

struct ChainRun {
  at::Tensor grad;
  OffloadStats stats;
  std::vector<int64_t> resident;
  bool timed_out = false;
};

// A chain of kNodes SinNodes over a [kRows, kCols] input on `device`;
// `offloader` null = no offloading at all.
ChainRun RunChain(Offloader* offloader, bool wait_for_read_ahead,
                  c10::Device device = c10::Device(c10::kCPU)) {
  torch::manual_seed(11);
  at::Tensor w = torch::randn({kRows, kCols}).to(device).requires_grad_(true);
  Probe& probe = TheProbe();
  probe = Probe();
  probe.offloader = offloader;
  probe.wait_for_read_ahead = wait_for_read_ahead;
  if (offloader != nullptr) offloader->BeginStep({w});
  at::Tensor loss;
  {
    OffloadScope scope(offloader);
    at::Tensor h = w * 1.5;  // not a leaf: its storage is an activation
    for (int64_t i = 0; i < kNodes; ++i) h = SinNode::apply(h, i);
    loss = h.sum();
  }
  // Copies out finished: the resident bytes seen in backward are only the
  // storages brought back.
  if (offloader != nullptr) offloader->Flush();
  loss.backward();
  ChainRun run;
  run.grad = w.grad().clone();
  if (offloader != nullptr) run.stats = offloader->EndStep();
  run.resident = probe.resident;
  run.timed_out = probe.timed_out;
  probe = Probe();
  return run;
}

std::unique_ptr<Offloader> MakeDisk(int prefetch_depth) {
  return MakeOffloader(Target::kDisk, /*min_offload_bytes=*/1024, /*enabled=*/true,
                       c10::Device(c10::kCPU), prefetch_depth);
}

// With every unpack waiting for the read-ahead of the next storage: each one
// but the first comes back ahead of need, once, within the depth's bound.
void ExpectReadAhead(Target target, c10::Device device, int depth) {
  const ChainRun reference = RunChain(nullptr, false, device);
  auto offloader =
      MakeOffloader(target, /*min_offload_bytes=*/1024, /*enabled=*/true, device, depth);
  ASSERT_NE(offloader, nullptr);
  const ChainRun run = RunChain(offloader.get(), /*wait_for_read_ahead=*/true, device);
  ASSERT_FALSE(run.timed_out) << "the read-ahead never brought a storage back";
  EXPECT_TRUE(torch::equal(run.grad, reference.grad));
  EXPECT_EQ(run.stats.tensors_offloaded, kNodes);
  EXPECT_EQ(run.stats.bytes_out, kNodes * kBytes);
  // Each storage came back exactly once: every one but the first unpacked
  // by the read-ahead, which the unpacks then found ready.
  EXPECT_EQ(run.stats.bytes_in, kNodes * kBytes);
  EXPECT_EQ(run.stats.bytes_prefetched, (kNodes - 1) * kBytes);
  // Never more than `depth` storages ahead of the one in use, and at least
  // the one waited for.
  ASSERT_EQ(run.resident.size(), static_cast<size_t>(kNodes));
  for (size_t i = 0; i + 1 < run.resident.size(); ++i) {
    EXPECT_LE(run.resident[i], (1 + depth) * kBytes) << "node " << kNodes - 1 - i;
    EXPECT_GE(run.resident[i], 2 * kBytes) << "node " << kNodes - 1 - i;
  }
  EXPECT_EQ(offloader->resident_saved_bytes(), 0);
  EXPECT_EQ(offloader->disk_bytes_held(), 0);
  EXPECT_EQ(offloader->host_bytes_held(), 0);
}

TEST(OffloadPrefetchTest, ReadAheadBringsBackTheNextStoragesBeforeTheirUnpack) {
  for (const int depth : {1, 2, 3}) {
    SCOPED_TRACE(depth);
    ExpectReadAhead(Target::kDisk, c10::Device(c10::kCPU), depth);
  }
}

TEST(OffloadPrefetchTest, CudaReadAheadFromHostAndDisk) {
  MEMPROFD_SKIP_WITHOUT_CUDA();
  for (const Target target : {Target::kHost, Target::kDisk}) {
    SCOPED_TRACE(TargetName(target));
    ExpectReadAhead(target, c10::Device(c10::kCUDA, 0), kCudaPrefetchDepth);
  }
}

TEST(OffloadPrefetchTest, DepthZeroReadsOnDemandOnly) {
  const ChainRun reference = RunChain(nullptr, false);
  auto offloader = MakeDisk(0);
  ASSERT_NE(offloader, nullptr);
  const ChainRun run = RunChain(offloader.get(), /*wait_for_read_ahead=*/false);
  EXPECT_TRUE(torch::equal(run.grad, reference.grad));
  EXPECT_EQ(run.stats.bytes_in, kNodes * kBytes);
  EXPECT_EQ(run.stats.bytes_prefetched, 0);
  EXPECT_GT(run.stats.reload_wait_ns, 0);
  // On demand, one storage at a time is back on the device.
  for (const int64_t resident : run.resident) EXPECT_EQ(resident, kBytes);
}

TEST(OffloadPrefetchTest, ManyStepsWithoutWaitingKeepGradientsAndCounts) {
  // The read-ahead racing the unpacks (nobody waits): whoever comes first
  // loads a storage, the other finds it loaded.
  const ChainRun reference = RunChain(nullptr, false);
  auto offloader = MakeDisk(2);
  ASSERT_NE(offloader, nullptr);
  for (int step = 0; step < 20; ++step) {
    const ChainRun run = RunChain(offloader.get(), /*wait_for_read_ahead=*/false);
    ASSERT_TRUE(torch::equal(run.grad, reference.grad)) << "step " << step;
    EXPECT_EQ(run.stats.bytes_in, kNodes * kBytes);
    EXPECT_LE(run.stats.bytes_prefetched, (kNodes - 1) * kBytes);
    for (const int64_t resident : run.resident) EXPECT_LE(resident, 3 * kBytes);
  }
  EXPECT_EQ(offloader->resident_saved_bytes(), 0);
  EXPECT_EQ(offloader->disk_bytes_held(), 0);
}

TEST(OffloadPrefetchTest, AutoIsOffOnACpuDevice) {
  // Reading back from the page cache is CPU work: by default a CPU compute
  // device reads on demand (offload_bench: read-ahead pays only with a core
  // to spare).
  OffloadOptions options;
  options.enabled = true;
  ASSERT_EQ(options.prefetch_depth, kPrefetchAuto);
  auto offloader = Offloader::Create(options, c10::Device(c10::kCPU));
  ASSERT_TRUE(offloader.ok()) << offloader.status();
  const ChainRun run = RunChain(offloader->get(), /*wait_for_read_ahead=*/false);
  EXPECT_EQ(run.stats.bytes_in, kNodes * kBytes);
  EXPECT_EQ(run.stats.bytes_prefetched, 0);
  EXPECT_EQ((*offloader)->options().prefetch_depth, kPrefetchAuto);  // as given
}

TEST(OffloadPrefetchTest, DepthParsesAndBadDepthsAreRejected) {
  EXPECT_EQ(*ParsePrefetchDepth("auto"), kPrefetchAuto);
  EXPECT_EQ(*ParsePrefetchDepth("0"), 0);
  EXPECT_EQ(*ParsePrefetchDepth("4"), 4);
  for (const char* bad : {"", "-1", "two", "1.5", "99999999999"}) {
    EXPECT_EQ(ParsePrefetchDepth(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  OffloadOptions options;
  options.enabled = true;
  options.prefetch_depth = -2;
  const auto offloader = Offloader::Create(options, c10::Device(c10::kCPU));
  EXPECT_EQ(offloader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(offloader.status().message().find("prefetch_depth"), std::string::npos);
}

}  // namespace
}  // namespace memprofd::offload
