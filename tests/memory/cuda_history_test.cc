// CUDA caching allocator statistics and history (cuda_stats.h) as the
// recorder and the memory_viz dump use them. They need a CUDA device and a
// build with MEMPROFD_WITH_CUDA (cuda_stats.cc is compiled only there), so
// each test skips, saying why, elsewhere; deploy/gpu-run.sh runs them.

#include <ATen/ATen.h>
#include <torch/version.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/common/attribution.h"
#include "core/memory/memory_viz.h"
#include "core/memory/recorder.h"
#include "core/memory/tagging.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/cuda.h"
#include "tests/testing/temp_dir.h"
#ifdef MEMPROFD_WITH_CUDA
#include "core/memory/cuda_stats.h"
#endif

namespace memprofd {
namespace memory {
namespace {

using ::memprofd::testing::HasCuda;
using ::memprofd::testing::kNeedsCuda;

#ifdef MEMPROFD_WITH_CUDA

constexpr int64_t kMaxEntries = 10000;
// Not a multiple of 512, so no other allocation of the process has this
// requested size, and above 1 MiB: the large pool.
constexpr int64_t kTracedBytes = (3 << 20) + 12345;
// A multiple of 512 at most 1 MiB: the small pool always cuts the block to
// exactly this size. The dump's segment blocks carry block sizes while trace
// entries carry requested sizes, and the viewer check matches a live traced
// allocation against its block.
constexpr int64_t kLiveBytes = 256 << 10;

at::Tensor CudaBytes(int64_t n) {
  return at::empty({n}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0));
}

uint64_t Address(const at::Tensor& t) { return reinterpret_cast<uint64_t>(t.data_ptr()); }

std::optional<CudaDeviceSample> Device0() {
  for (const CudaDeviceSample& s : SampleCudaDevices()) {
    if (s.device == 0) return s;
  }
  return std::nullopt;
}

// "<action> <size>" for each alloc/free entry at `addr` in device 0's trace.
// Segment entries are left out: a new segment's address is also its first
// block's, and whether a segment is new depends on what ran before.
std::vector<std::string> Device0TraceAt(const CudaAllocatorSnapshot& s, uint64_t addr) {
  std::vector<std::string> out;
  if (s.device_traces.empty()) return out;
  for (const VizTraceEntry& e : s.device_traces[0]) {
    if (e.addr != addr) continue;
    switch (e.action) {
      case VizAction::kAlloc:
        out.push_back(absl::StrCat("alloc ", e.size));
        break;
      case VizAction::kFreeRequested:
        out.push_back(absl::StrCat("free_requested ", e.size));
        break;
      case VizAction::kFreeCompleted:
        out.push_back(absl::StrCat("free_completed ", e.size));
        break;
      default:
        break;
    }
  }
  return out;
}

// The global recorder and the CUDA history are process-wide: each test starts
// from a stopped, empty history and leaves one behind, however it ends, so
// that no other test sees its entries.
class HistoryCleanup {
 public:
  HistoryCleanup() { Reset(); }
  ~HistoryCleanup() { Reset(); }

 private:
  static void Reset() {
    MemoryRecorder::Global().StopRecording();
    MemoryRecorder::Global().ClearHistory();
  }
};

// `python -c`: prints what a memory_viz pickle (argv[1]) holds on device 0 at the address
// argv[2] ("live") and argv[3] ("freed"): each alloc/free trace entry as
// "<name> <action> <size>", then each segment block starting at the live
// address as "live block <state> <size>".
constexpr char kDevice0Script[] = R"(import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
names = {int(sys.argv[2]): "live", int(sys.argv[3]): "freed"}
wanted = ("alloc", "free_requested", "free_completed")
for e in d["device_traces"][0]:
    if e["addr"] in names and e["action"] in wanted:
        print(names[e["addr"]], e["action"], e["size"])
for s in d["segments"]:
    for b in s["blocks"]:
        if s["device"] == 0 and b["address"] == int(sys.argv[2]):
            print("live block", b["state"], b["size"])
)";

#endif  // MEMPROFD_WITH_CUDA

TEST(CudaHistoryTest, AllocatorTraceOutlivesStopRecordingUntilClearHistory) {
  if (!HasCuda()) GTEST_SKIP() << kNeedsCuda;
#ifdef MEMPROFD_WITH_CUDA
  HistoryCleanup cleanup;
  MemoryRecorder& r = MemoryRecorder::Global();
  // First in this file, so that in a whole memory_test run nothing has used
  // CUDA yet: recording must then initialise CUDA itself, or the allocator
  // records nothing on device 0. The XML report says whether this run did.
  RecordProperty("cuda_initialised_by_recording", Device0().has_value() ? "no" : "yes");
  ASSERT_TRUE(r.StartRecording(kMaxEntries).ok());
  at::Tensor t = CudaBytes(kTracedBytes);
  const uint64_t addr = Address(t);
  t.reset();
  r.StopRecording();

  const std::vector<std::string> traced = {absl::StrCat("alloc ", kTracedBytes),
                                           absl::StrCat("free_requested ", kTracedBytes),
                                           absl::StrCat("free_completed ", kTracedBytes)};
  // The allocator empties its own trace when recording stops; these are the
  // entries cuda_stats kept.
  EXPECT_EQ(Device0TraceAt(CaptureCudaSnapshot(), addr), traced);
  // Recording again continues the history instead of restarting it.
  ASSERT_TRUE(r.StartRecording(kMaxEntries).ok());
  EXPECT_EQ(Device0TraceAt(CaptureCudaSnapshot(), addr), traced);
  r.StopRecording();

  r.ClearHistory();
  const CudaAllocatorSnapshot cleared = CaptureCudaSnapshot();
  for (size_t d = 0; d < cleared.device_traces.size(); ++d) {
    EXPECT_EQ(cleared.device_traces[d].size(), 0u) << "cuda:" << d;
  }
#endif
}

TEST(CudaStatsTest, DeviceStatsFollowAnAllocationAndResetPeaksToCurrent) {
  if (!HasCuda()) GTEST_SKIP() << kNeedsCuda;
#ifdef MEMPROFD_WITH_CUDA
  // Sets up device 0's allocator, so that `before` is a real sample.
  const at::Tensor warm = CudaBytes(1);
  const std::optional<CudaDeviceSample> before = Device0();
  ASSERT_TRUE(before.has_value()) << "no sample of cuda:0 after allocating on it";

  at::Tensor t = CudaBytes(kTracedBytes);
  const std::optional<CudaDeviceSample> held = Device0();
  ASSERT_TRUE(held.has_value());
  EXPECT_GE(held->allocated_bytes - before->allocated_bytes, kTracedBytes);
  EXPECT_EQ(held->alloc_count - before->alloc_count, 1);
  EXPECT_GE(held->peak_allocated_bytes, held->allocated_bytes);
  EXPECT_GE(held->reserved_bytes, held->allocated_bytes);

  t.reset();
  const std::optional<CudaDeviceSample> freed = Device0();
  ASSERT_TRUE(freed.has_value());
  EXPECT_EQ(freed->allocated_bytes, before->allocated_bytes);
  EXPECT_EQ(freed->free_count - before->free_count, 1);
  EXPECT_GE(freed->peak_allocated_bytes, held->allocated_bytes);

  ResetCudaPeaks();
  const std::optional<CudaDeviceSample> reset = Device0();
  ASSERT_TRUE(reset.has_value());
  EXPECT_EQ(reset->allocated_bytes, before->allocated_bytes);
  EXPECT_EQ(reset->peak_allocated_bytes, reset->allocated_bytes);
#endif
}

TEST(CudaHistoryTest, SetCudaHistoryFindsThisLibTorchsRecordHistory) {
  if (!HasCuda()) GTEST_SKIP() << kNeedsCuda;
#ifdef MEMPROFD_WITH_CUDA
  HistoryCleanup cleanup;
  const absl::Status on = SetCudaHistory(true, kMaxEntries);
  const absl::Status off = SetCudaHistory(false, 0);
  // OK means overload ranking found this LibTorch's recordHistory.
  EXPECT_TRUE(on.ok()) << "LibTorch " << TORCH_VERSION << ": " << on;
  EXPECT_TRUE(off.ok()) << off;
#endif
}

TEST(CudaHistoryTest, MemoryVizDumpHoldsDevice0SegmentsAndTrace) {
  if (!HasCuda()) GTEST_SKIP() << kNeedsCuda;
#ifdef MEMPROFD_WITH_CUDA
  HistoryCleanup cleanup;
  MemoryRecorder& r = MemoryRecorder::Global();
  ASSERT_TRUE(r.StartRecording(kMaxEntries).ok());
  // Allocated first and held, so that the freed tensor cannot share its
  // address.
  const at::Tensor live = CudaBytes(kLiveBytes);
  at::Tensor freed = CudaBytes(kTracedBytes);
  const uint64_t freed_addr = Address(freed);
  freed.reset();
  const std::string pickle = CaptureMemoryVizPickle(MemoryRecorder::Global());
  r.StopRecording();

  const testing::TempDir dir;
  const std::string path = dir.WriteFile("cuda.pkl", pickle);
  std::string summary;
  EXPECT_EQ(
      testing::RunPython({testing::SourcePath("tests/memory/check_memory_viz.py"), path},
                         &summary),
      0)
      << summary;
  // CUDA devices 0..n-1, then the CPU.
  EXPECT_NE(summary.find(absl::StrCat("\"devices\": ", CudaDeviceCount() + 1, ",")),
            std::string::npos)
      << summary;
  std::string device0;
  EXPECT_EQ(testing::RunPython({"-c", kDevice0Script, path, absl::StrCat(Address(live)),
                                absl::StrCat(freed_addr)},
                               &device0),
            0)
      << device0;
  const std::string expected =
      absl::StrCat("live alloc ", kLiveBytes, "\nfreed alloc ", kTracedBytes,
                   "\nfreed free_requested ", kTracedBytes, "\nfreed free_completed ",
                   kTracedBytes, "\nlive block active_allocated ", kLiveBytes, "\n");
  EXPECT_EQ(device0, expected);
#endif
}

// The CUDA accounting (AttachCudaAccounting): each caching-allocator block
// carries the allocating thread's attribution into the recorder's cells of
// its device, at its requested size; re-tags move it; its free takes it out.
// Other tests of this binary allocate on cuda:0 too, before and after the
// attach, so the sums are checked as differences around this test's blocks.
TEST(CudaAccountingTest, BlocksCarryTheirOriginIntoTheDevicesCells) {
  if (!HasCuda()) GTEST_SKIP() << kNeedsCuda;
#ifdef MEMPROFD_WITH_CUDA
  ASSERT_TRUE(AttachCudaAccounting().ok());
  ASSERT_TRUE(AttachCudaAccounting().ok()) << "a second attach must be a no-op";
  EXPECT_TRUE(IsCudaAccountingAttached());
  MemoryRecorder& r = MemoryRecorder::Global();
  auto sum = [](const std::array<int64_t, kNumCategories>& a) {
    int64_t n = 0;
    for (int64_t v : a) n += v;
    return n;
  };
  const at::Tensor warm = CudaBytes(1);
  const std::optional<CudaDeviceSample> before = Device0();
  ASSERT_TRUE(before.has_value());
  const int64_t cells_before = sum(r.CategoryBytesOf(0));
  const int64_t opt_before =
      r.CategoryBytesOf(0)[static_cast<size_t>(Category::kOptimizerState)];

  const ModuleId module = InternModule("test.cuda.layers.0.mlp");
  at::Tensor state, temp;
  {
    ModuleScope m(module);
    CategoryScope c(Category::kOptimizerState);
    state = CudaBytes(kTracedBytes);
  }
  {
    ModuleScope m(module);
    CategoryScope c(Category::kTemporaries);
    temp = CudaBytes(kLiveBytes);
  }
  const std::optional<Attribution> a = StorageAttribution(state);
  ASSERT_TRUE(a.has_value()) << "the tracker did not see the block allocated";
  EXPECT_EQ(a->module, module);
  EXPECT_EQ(a->category, Category::kOptimizerState);
  EXPECT_EQ(
      r.CategoryBytesOf(0)[static_cast<size_t>(Category::kOptimizerState)] - opt_before,
      kTracedBytes);
  // The cells count requested sizes, as the allocator's requested bytes do.
  const std::optional<CudaDeviceSample> held = Device0();
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->requested_bytes - before->requested_bytes, kTracedBytes + kLiveBytes);
  EXPECT_EQ(sum(r.CategoryBytesOf(0)) - cells_before, kTracedBytes + kLiveBytes);

  bool listed = false;
  for (const LiveBlock& b : LiveCudaBlocks()) {
    if (b.device == 0 && b.addr == Address(state)) {
      listed = true;
      EXPECT_EQ(b.size, kTracedBytes);
      EXPECT_EQ(b.origin.module, module);
    }
  }
  EXPECT_TRUE(listed);

  // The offloader's pack marks what autograd saved: temporaries only.
  EXPECT_TRUE(MarkSavedActivation(temp.narrow(0, 16, 16)));
  EXPECT_FALSE(MarkSavedActivation(state));
  EXPECT_EQ(StorageAttribution(temp)->category, Category::kSavedActivations);
  EXPECT_TRUE(TagStorage(state, module, Category::kGradients));
  EXPECT_EQ(StorageAttribution(state)->category, Category::kGradients);
  EXPECT_EQ(r.CategoryBytesOf(0)[static_cast<size_t>(Category::kOptimizerState)],
            opt_before);

  const uint64_t freed = Address(state);
  state.reset();
  temp.reset();
  EXPECT_FALSE(CudaBlockAttribution(0, freed).has_value());
  EXPECT_EQ(sum(r.CategoryBytesOf(0)), cells_before);
  const std::optional<CudaDeviceSample> after = Device0();
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->requested_bytes, before->requested_bytes);
#endif
}

}  // namespace
}  // namespace memory
}  // namespace memprofd
