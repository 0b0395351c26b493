#include "core/memory/recorder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <thread>
#include <vector>

#include "core/common/phase.h"
#include "gtest/gtest.h"
#include "tests/memory/test_util.h"

namespace memprofd {
namespace memory {
namespace {

std::map<Phase, int64_t> PhasePeaks(const MemoryStatsView& v, const std::string& device) {
  std::map<Phase, int64_t> out;
  for (const PhasePeak& p : v.last_step_phase_peaks) {
    if (p.device == device) out[p.phase] = p.peak_bytes;
  }
  return out;
}

int64_t LastStepPeak(const MemoryStatsView& v, const std::string& device) {
  for (const StepPeak& p : v.last_step_peaks) {
    if (p.device == device) return p.peak_bytes;
  }
  return -1;
}

// Restores the global listener after tests that use a private recorder.
class ListenerGuard {
 public:
  explicit ListenerGuard(PhaseListener* l) { SetPhaseListener(l); }
  ~ListenerGuard() { SetPhaseListener(&MemoryRecorder::Global()); }
};

TEST(MemoryRecorderTest, PerPhasePeaksOfAManualStep) {
  MemoryRecorder r;
  ListenerGuard guard(&r);
  BeginStep(1);
  {
    PhaseScope fwd(Phase::kForward);
    r.RecordAlloc(kCpuDevice, 0x1000, 100);
    r.RecordAlloc(kCpuDevice, 0x2000, 200);
  }
  {
    PhaseScope bwd(Phase::kBackward);
    r.RecordAlloc(kCpuDevice, 0x3000, 50);  // 350
    r.RecordFree(kCpuDevice, 0x1000, 100);
    r.RecordFree(kCpuDevice, 0x2000, 200);  // 50
  }
  {
    PhaseScope opt(Phase::kOptimizer);      // enters holding 50
    r.RecordAlloc(kCpuDevice, 0x4000, 10);  // 60
  }
  r.RecordFree(kCpuDevice, 0x3000, 50);
  r.RecordFree(kCpuDevice, 0x4000, 10);
  EndStep(1);
  MemoryStatsView v = r.Stats();
  EXPECT_EQ(v.last_step, 1);
  std::map<Phase, int64_t> peaks = PhasePeaks(v, "cpu");
  EXPECT_EQ(peaks[Phase::kForward], 300);
  EXPECT_EQ(peaks[Phase::kBackward], 350);
  EXPECT_EQ(peaks[Phase::kOptimizer], 60);
  EXPECT_EQ(peaks[Phase::kIdle], 300);  // between forward and backward
  EXPECT_EQ(peaks.count(Phase::kSnapshot), 0u);
  EXPECT_EQ(LastStepPeak(v, "cpu"), 350);
  EXPECT_EQ(r.CurrentBytes(kCpuDevice), 0);
  EXPECT_EQ(r.AllocCount(kCpuDevice), 4);
  EXPECT_EQ(r.FreeCount(kCpuDevice), 4);

  // The next step starts from scratch: its peaks are its own.
  BeginStep(2);
  {
    PhaseScope fwd(Phase::kForward);
    r.RecordAlloc(kCpuDevice, 0x1000, 7);
    r.RecordFree(kCpuDevice, 0x1000, 7);
  }
  EndStep(2);
  v = r.Stats();
  EXPECT_EQ(v.last_step, 2);
  peaks = PhasePeaks(v, "cpu");
  EXPECT_EQ(peaks[Phase::kForward], 7);
  EXPECT_EQ(peaks.count(Phase::kBackward), 0u);
  EXPECT_EQ(LastStepPeak(v, "cpu"), 7);
  // The device peak is not reset by steps, only by ResetPeak().
  EXPECT_EQ(r.PeakBytes(kCpuDevice), 350);
  r.ResetPeak();
  EXPECT_EQ(r.PeakBytes(kCpuDevice), 0);
}

TEST(MemoryRecorderTest, TensorStepPhasePeaksMatchAllocatorTotals) {
  EnsureAccountingInstalled();
  MemoryRecorder& r = MemoryRecorder::Global();
  const int64_t base = r.CurrentBytes(kCpuDevice);
  BeginStep(41);
  std::vector<at::Tensor> saved;
  {
    PhaseScope fwd(Phase::kForward);
    saved.push_back(at::empty({1000}, at::kByte));
    saved.push_back(at::empty({3000}, at::kByte));
    at::Tensor tmp = at::empty({500}, at::kByte);  // forward peak 4500
  }
  {
    PhaseScope bwd(Phase::kBackward);
    at::Tensor grad = at::empty({2000}, at::kByte);  // 6000
    saved.clear();                                   // 2000
    at::Tensor tmp = at::empty({100}, at::kByte);    // 2100
  }
  EndStep(41);
  const MemoryStatsView v = r.Stats();
  EXPECT_EQ(v.last_step, 41);
  std::map<Phase, int64_t> peaks = PhasePeaks(v, "cpu");
  EXPECT_EQ(peaks[Phase::kForward], base + 4500);
  EXPECT_EQ(peaks[Phase::kBackward], base + 6000);
  EXPECT_EQ(LastStepPeak(v, "cpu"), base + 6000);
  EXPECT_EQ(r.CurrentBytes(kCpuDevice), base);
  EXPECT_GE(r.PeakBytes(kCpuDevice), base + 6000);
}

TEST(MemoryRecorderTest, RingKeepsExactlyTheNewestN) {
  MemoryRecorder r;
  ASSERT_TRUE(r.StartRecording(5).ok());
  for (int i = 0; i < 12; ++i) r.RecordAlloc(kCpuDevice, 0x100 + i, i + 1);
  HistorySnapshot h = r.History();
  ASSERT_EQ(h.entries.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(h.entries[i].addr, 0x100u + 7 + i);
    EXPECT_EQ(h.entries[i].size, 8 + i);
    EXPECT_EQ(h.entries[i].action, HistoryAction::kAlloc);
    EXPECT_EQ(h.entries[i].device, kCpuDevice);
  }
  EXPECT_EQ(h.dropped, 7);
  EXPECT_EQ(h.max_entries, 5);
  const MemoryStatsView v = r.Stats();
  EXPECT_TRUE(v.recording);
  EXPECT_EQ(v.history_entries, 5);
  EXPECT_EQ(v.history_max_entries, 5);
  EXPECT_EQ(v.history_dropped, 7);

  // Stop keeps entries and ignores new events; counters still count.
  r.StopRecording();
  r.RecordFree(kCpuDevice, 0x100, 1);
  EXPECT_EQ(r.History().entries.back().addr, 0x100u + 11);
  EXPECT_EQ(r.FreeCount(kCpuDevice), 1);
  EXPECT_FALSE(r.Stats().recording);

  // Growing keeps what is held; shrinking keeps the newest.
  ASSERT_TRUE(r.StartRecording(8).ok());
  r.RecordFree(kCpuDevice, 0x200, 3);
  h = r.History();
  ASSERT_EQ(h.entries.size(), 6u);
  EXPECT_EQ(h.entries.front().addr, 0x100u + 7);
  EXPECT_EQ(h.entries.back().addr, 0x200u);
  EXPECT_EQ(h.entries.back().action, HistoryAction::kFree);
  ASSERT_TRUE(r.StartRecording(2).ok());
  h = r.History();
  ASSERT_EQ(h.entries.size(), 2u);
  EXPECT_EQ(h.entries[0].addr, 0x100u + 11);
  EXPECT_EQ(h.entries[1].addr, 0x200u);
  EXPECT_EQ(h.dropped, 11);

  r.ClearHistory();
  EXPECT_TRUE(r.History().entries.empty());
  EXPECT_EQ(r.History().dropped, 0);
}

TEST(MemoryRecorderTest, RingUnderConcurrentWritersStaysBoundedAndWhole) {
  MemoryRecorder r;
  ASSERT_TRUE(r.StartRecording(1000).ok());
  constexpr int kThreads = 4;
  constexpr int kEvents = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&r, t] {
      for (int i = 0; i < kEvents; ++i) {
        const uint64_t addr = (static_cast<uint64_t>(t) << 32) | static_cast<uint64_t>(i);
        r.RecordAlloc(kCpuDevice, addr, t + 1);
        r.RecordFree(kCpuDevice, addr, t + 1);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const HistorySnapshot h = r.History();
  ASSERT_EQ(h.entries.size(), 1000u);
  EXPECT_EQ(h.dropped, 2 * kThreads * kEvents - 1000);
  // Each entry is intact: its size matches the thread encoded in its address.
  for (const HistoryEntry& e : h.entries) {
    EXPECT_EQ(e.size, static_cast<int64_t>(e.addr >> 32) + 1);
  }
  EXPECT_EQ(r.CurrentBytes(kCpuDevice), 0);
  EXPECT_EQ(r.AllocCount(kCpuDevice), kThreads * kEvents);
}

TEST(MemoryRecorderTest, EntriesCarryPhaseStepAndTime) {
  MemoryRecorder r;
  ListenerGuard guard(&r);
  ASSERT_TRUE(r.StartRecording(10).ok());
  BeginStep(7);
  {
    PhaseScope bwd(Phase::kBackward);
    r.RecordAlloc(kCpuDevice, 0x10, 16);
  }
  EndStep(7);
  const HistorySnapshot h = r.History();
  ASSERT_EQ(h.entries.size(), 1u);
  EXPECT_EQ(h.entries[0].phase, Phase::kBackward);
  EXPECT_EQ(h.entries[0].step, 7);
  EXPECT_GT(h.entries[0].time_us, 1'600'000'000'000'000);  // after 2020
}

TEST(MemoryRecorderTest, RejectsBadHistorySizes) {
  MemoryRecorder r;
  EXPECT_EQ(r.StartRecording(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.StartRecording(HistoryRing::kMaxEntriesLimit + 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(r.Stats().recording);
}

TEST(MemoryRecorderTest, IgnoresUnknownDevicesAndNamesKnownOnes) {
  MemoryRecorder r;
  r.RecordAlloc(MemoryRecorder::kMaxCudaDevices, 0x1, 10);
  r.RecordAlloc(-2, 0x1, 10);
  EXPECT_EQ(r.CurrentBytes(MemoryRecorder::kMaxCudaDevices), 0);
  EXPECT_EQ(DeviceName(kCpuDevice), "cpu");
  EXPECT_EQ(DeviceName(3), "cuda:3");
  const MemoryStatsView v = r.Stats();
  ASSERT_FALSE(v.devices.empty());
  EXPECT_EQ(v.devices[0].name, "cpu");
  EXPECT_EQ(v.devices[0].current_bytes, 0);
}

}  // namespace
}  // namespace memory
}  // namespace memprofd
