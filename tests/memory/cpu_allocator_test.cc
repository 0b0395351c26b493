#include "core/memory/cpu_allocator.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/synchronization/barrier.h"
#include "core/common/torch_boundary.h"
#include "core/memory/oom_report.h"
#include "core/memory/recorder.h"
#include "gtest/gtest.h"
#include "tests/memory/test_util.h"

namespace memprofd {
namespace memory {
namespace {

MemoryRecorder& R() { return MemoryRecorder::Global(); }

at::Tensor Bytes(int64_t n) { return at::empty({n}, at::kByte); }

TEST(CountingCpuAllocatorTest, InstallIsIdempotentAndWrapsTheCpuSlot) {
  EnsureAccountingInstalled();
  c10::Allocator* first = c10::GetAllocator(c10::DeviceType::CPU);
  EXPECT_TRUE(InstallCountingCpuAllocator().ok());
  EXPECT_EQ(c10::GetAllocator(c10::DeviceType::CPU), first);
  EXPECT_TRUE(IsCountingCpuAllocatorInstalled());
  EXPECT_TRUE(R().Stats().cpu_allocator_installed);
}

TEST(CountingCpuAllocatorTest, CountsEveryEventFromManyThreadsExactly) {
  EnsureAccountingInstalled();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 50;
  const int64_t base = R().CurrentBytes(kCpuDevice);
  const int64_t allocs0 = R().AllocCount(kCpuDevice);
  const int64_t frees0 = R().FreeCount(kCpuDevice);
  R().ResetPeak();
  int64_t expected_total = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) expected_total += 1000 * (t + 1) + i;
  }
  std::vector<std::vector<at::Tensor>> held(kThreads);
  absl::Barrier* allocated = new absl::Barrier(kThreads + 1);
  absl::Barrier* checked = new absl::Barrier(kThreads + 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) held[t].push_back(Bytes(1000 * (t + 1) + i));
      if (allocated->Block()) delete allocated;
      if (checked->Block()) delete checked;
      held[t].clear();
    });
  }
  if (allocated->Block()) delete allocated;
  EXPECT_EQ(R().CurrentBytes(kCpuDevice), base + expected_total);
  EXPECT_EQ(R().AllocCount(kCpuDevice) - allocs0, kThreads * kPerThread);
  EXPECT_EQ(R().PeakBytes(kCpuDevice), base + expected_total);
  if (checked->Block()) delete checked;
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(R().CurrentBytes(kCpuDevice), base);
  EXPECT_EQ(R().FreeCount(kCpuDevice) - frees0, kThreads * kPerThread);
  EXPECT_EQ(R().PeakBytes(kCpuDevice), base + expected_total);
}

TEST(CountingCpuAllocatorTest, CountsAllocationsInsideParallelFor) {
  EnsureAccountingInstalled();
  constexpr int64_t kItems = 64;
  const int64_t base = R().CurrentBytes(kCpuDevice);
  const int64_t allocs0 = R().AllocCount(kCpuDevice);
  const int64_t frees0 = R().FreeCount(kCpuDevice);
  std::vector<at::Tensor> held(kItems);
  std::mutex mu;
  std::set<std::thread::id> ids;
  at::parallel_for(0, kItems, 1, [&](int64_t begin, int64_t end) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    for (int64_t i = begin; i < end; ++i) held[static_cast<size_t>(i)] = Bytes(512 + i);
  });
  int64_t expected = 0;
  for (int64_t i = 0; i < kItems; ++i) expected += 512 + i;
  EXPECT_EQ(R().CurrentBytes(kCpuDevice), base + expected);
  EXPECT_EQ(R().AllocCount(kCpuDevice) - allocs0, kItems);
  if (at::get_num_threads() > 1) {
    EXPECT_GT(ids.size(), 1u) << "parallel_for ran on one thread only";
  }
  // Free inside parallel_for too, on whichever worker owns the index.
  at::parallel_for(0, kItems, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) held[static_cast<size_t>(i)].reset();
  });
  EXPECT_EQ(R().CurrentBytes(kCpuDevice), base);
  EXPECT_EQ(R().FreeCount(kCpuDevice) - frees0, kItems);
}

TEST(CountingCpuAllocatorTest, FreeOnAnotherThreadIsCountedOnce) {
  EnsureAccountingInstalled();
  const int64_t base = R().CurrentBytes(kCpuDevice);
  const int64_t frees0 = R().FreeCount(kCpuDevice);
  at::Tensor t = Bytes(4096);
  EXPECT_EQ(R().CurrentBytes(kCpuDevice), base + 4096);
  std::thread([moved = std::move(t)]() mutable { moved.reset(); }).join();
  EXPECT_EQ(R().CurrentBytes(kCpuDevice), base);
  EXPECT_EQ(R().FreeCount(kCpuDevice) - frees0, 1);
}

TEST(CountingCpuAllocatorTest, OperatorsAndRawAllocateAreCountedAndReturnToBaseline) {
  EnsureAccountingInstalled();
  const int64_t base = R().CurrentBytes(kCpuDevice);
  {
    at::Tensor a = at::randn({64, 64});
    at::Tensor b = at::matmul(a, a).relu().sum(0);
    EXPECT_GE(R().CurrentBytes(kCpuDevice), base + 64 * 64 * 4 + 64 * 4);
    // Data stays 64-byte aligned behind the header.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 64, 0u);
  }
  EXPECT_EQ(R().CurrentBytes(kCpuDevice), base);
  c10::Allocator* alloc = c10::GetAllocator(c10::DeviceType::CPU);
  void* p = alloc->raw_allocate(300);
  EXPECT_EQ(R().CurrentBytes(kCpuDevice), base + 300);
  alloc->raw_deallocate(p);
  EXPECT_EQ(R().CurrentBytes(kCpuDevice), base);
}

TEST(CountingCpuAllocatorTest, LiveBlocksListExactlyTheLiveAllocations) {
  EnsureAccountingInstalled();
  at::Tensor t = Bytes(12345);
  const uint64_t addr = reinterpret_cast<uint64_t>(t.data_ptr());
  auto find = [&] {
    const std::vector<LiveBlock> live = LiveCpuBlocks();
    return std::count_if(live.begin(), live.end(), [&](const LiveBlock& b) {
      return b.addr == addr && b.size == 12345 && b.device == kCpuDevice;
    });
  };
  EXPECT_EQ(find(), 1);
  int64_t live_total = 0;
  for (const LiveBlock& b : LiveCpuBlocks()) live_total += b.size;
  EXPECT_EQ(live_total, R().CurrentBytes(kCpuDevice));
  t.reset();
  EXPECT_EQ(find(), 0);
}

TEST(CountingCpuAllocatorTest, AutogradBackwardReturnsToBaseline) {
  EnsureAccountingInstalled();
  const int64_t base = R().CurrentBytes(kCpuDevice);
  const int64_t allocs0 = R().AllocCount(kCpuDevice);
  const int64_t frees0 = R().FreeCount(kCpuDevice);
  {
    at::Tensor w = at::randn({32, 32}).requires_grad_(true);
    at::Tensor x = at::randn({8, 32});
    at::Tensor loss = at::matmul(x, w).tanh().pow(2).sum();
    loss.backward();
    EXPECT_TRUE(w.grad().defined());
    EXPECT_GT(R().CurrentBytes(kCpuDevice), base);
  }
  EXPECT_EQ(R().CurrentBytes(kCpuDevice), base);
  EXPECT_GT(R().AllocCount(kCpuDevice) - allocs0, 5);
  EXPECT_EQ(R().AllocCount(kCpuDevice) - allocs0, R().FreeCount(kCpuDevice) - frees0);
}

TEST(CountingCpuAllocatorTest, ZeroByteTensorsAreNotEvents) {
  EnsureAccountingInstalled();
  const int64_t allocs0 = R().AllocCount(kCpuDevice);
  at::Tensor t = at::empty({0});
  EXPECT_EQ(R().AllocCount(kCpuDevice), allocs0);
}

TEST(CountingCpuAllocatorTest, TheDeviceLimitRefusesWhatGoesBeyondItAsOutOfMemory) {
  EnsureAccountingInstalled();
  const absl::Cleanup no_limit = [] { SetCpuMemoryLimit(0); };
  (void)TakeOomCapture();
  const int64_t base = CpuAllocatedBytes();
  EXPECT_EQ(base, R().CurrentBytes(kCpuDevice));
  const int64_t limit = base + (int64_t{1} << 20);
  SetCpuMemoryLimit(limit);
  EXPECT_EQ(CpuMemoryLimit(), limit);
  at::Tensor half = Bytes(512 << 10);
  EXPECT_EQ(CpuAllocatedBytes(), base + (512 << 10));
  // What the limit leaves is the device's room.
  const DeviceRoom room = QueryDeviceRoom(kCpuDevice);
  EXPECT_EQ(room.total_bytes, limit);
  EXPECT_EQ(room.free_bytes, limit - base - (512 << 10));

  // 768 KiB more would pass the limit: refused as out of memory, counted
  // nowhere, with the OOM capture and the status every OOM gets.
  const int64_t allocs0 = R().AllocCount(kCpuDevice);
  const absl::Status status =
      TorchBoundary("step", [] { at::Tensor t = Bytes(768 << 10); });
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "out of memory")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "--device_memory_limit")) << status;
  EXPECT_EQ(R().AllocCount(kCpuDevice), allocs0);
  EXPECT_EQ(CpuAllocatedBytes(), base + (512 << 10));
  std::optional<OomCapture> capture = TakeOomCapture();
  ASSERT_TRUE(capture.has_value());
  EXPECT_EQ(capture->device, kCpuDevice);
  EXPECT_EQ(capture->requested_bytes, 768 << 10);
  EXPECT_EQ(capture->total_bytes, limit);
  EXPECT_EQ(capture->free_bytes, limit - base - (512 << 10));
  EXPECT_TRUE(std::any_of(capture->live.begin(), capture->live.end(),
                          [](const LiveBlock& b) { return b.size == (512 << 10); }));

  // Freed bytes are room again; lifting the limit lifts the refusal.
  half.reset();
  EXPECT_EQ(CpuAllocatedBytes(), base);
  EXPECT_NO_THROW(Bytes(768 << 10));
  SetCpuMemoryLimit(base + 1024);
  EXPECT_THROW(Bytes(768 << 10), c10::OutOfMemoryError);
  SetCpuMemoryLimit(0);
  EXPECT_NO_THROW(Bytes(768 << 10));
}

}  // namespace
}  // namespace memory
}  // namespace memprofd
