// memory_bench: what memory accounting costs (`--attribution`: only the
// per-event costs and the tiny step with op attribution off vs on). Prints
//  - ns per recorded event (one alloc or one free) in the recorder alone,
//    history recording off vs on, on 1 and 2 threads;
//  - ns per alloc+free pair through LibTorch's CPU allocator: the default
//    allocator, the counting wrapper with recording off, and on;
//  - step time of a small MLP forward/backward/SGD loop (a stand-in for a
//    training step) with recording off vs on, interleaved, medians and ratio.
// Not a test: it asserts nothing. Thread settings are printed because they
// dominate step time.

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/common/attribution.h"
#include "core/common/phase.h"
#include "core/memory/install.h"
#include "core/memory/memory_viz.h"
#include "core/memory/op_attribution.h"
#include "core/memory/recorder.h"
#include "core/model/llama.h"
#include "core/train/data.h"
#include "core/train/memory_tags.h"
#include "core/train/trainer.h"

namespace {

using memprofd::BeginStep;
using memprofd::EndStep;
using memprofd::Phase;
using memprofd::PhaseScope;
using memprofd::memory::kCpuDevice;
using memprofd::memory::MemoryRecorder;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double RecorderNsPerEvent(bool recording, int threads) {
  MemoryRecorder r;
  if (recording && !r.StartRecording(100000).ok()) std::abort();
  constexpr int kPairs = 2'000'000;
  const auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&r, t] {
      for (int i = 0; i < kPairs; ++i) {
        const uint64_t addr =
            (static_cast<uint64_t>(t) << 40) + 64u * static_cast<uint64_t>(i);
        r.RecordAlloc(kCpuDevice, addr, 256);
        r.RecordFree(kCpuDevice, addr, 256);
      }
    });
  }
  for (auto& th : pool) th.join();
  // Per event per thread: the latency one allocating thread sees.
  return Seconds(t0, Clock::now()) * 1e9 / (2.0 * kPairs);
}

// As RecorderNsPerEvent, with the attribution the allocator wrapper passes
// (CurrentAttribution() read per event, a module and op set on each thread).
double AttributedNsPerEvent(bool recording, int threads) {
  MemoryRecorder r;
  if (recording && !r.StartRecording(100000).ok()) std::abort();
  constexpr int kPairs = 2'000'000;
  const auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&r, t] {
      memprofd::ModuleScope module(
          memprofd::InternModule(t == 0 ? "bench.thread0" : "bench.thread1"));
      for (int i = 0; i < kPairs; ++i) {
        const uint64_t addr =
            (static_cast<uint64_t>(t) << 40) + 64u * static_cast<uint64_t>(i);
        const memprofd::Attribution a = memprofd::CurrentAttribution();
        r.RecordAlloc(kCpuDevice, addr, 256, a);
        r.RecordFree(kCpuDevice, addr, 256, a);
      }
    });
  }
  for (auto& th : pool) th.join();
  return Seconds(t0, Clock::now()) * 1e9 / (2.0 * kPairs);
}

double AllocatorNsPerPair(c10::Allocator* alloc, size_t bytes) {
  constexpr int kPairs = 1'000'000;
  const auto t0 = Clock::now();
  for (int i = 0; i < kPairs; ++i) {
    c10::DataPtr p = alloc->allocate(bytes);
    if (p.get() == nullptr) std::abort();
  }
  return Seconds(t0, Clock::now()) * 1e9 / kPairs;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One training step, run with history recording off and on, interleaved in
// rounds to spread machine noise over both; prints medians, the ratio, and
// the overhead predicted from the measured per-event cost.
void StepBench(const char* name, const std::function<void()>& run_step,
               double event_cost_ns) {
  MemoryRecorder& g = MemoryRecorder::Global();
  for (int i = 0; i < 10; ++i) run_step();
  // Aim at ~3 s per mode whatever the step time.
  const auto t0 = Clock::now();
  for (int i = 0; i < 10; ++i) run_step();
  const double step_s = Seconds(t0, Clock::now()) / 10;
  const int rounds = 10;
  const int steps_per_round = std::max(5, static_cast<int>(0.3 / step_s));
  std::vector<double> off_ms, on_ms;
  int64_t events_per_step = 0;
  for (int round = 0; round < rounds; ++round) {
    for (bool recording : {false, true}) {
      if (recording) {
        g.ClearHistory();
        if (!g.StartRecording(1'000'000).ok()) std::abort();
      }
      const int64_t events0 = g.AllocCount(kCpuDevice) + g.FreeCount(kCpuDevice);
      for (int i = 0; i < steps_per_round; ++i) {
        const auto s0 = Clock::now();
        run_step();
        (recording ? on_ms : off_ms).push_back(Seconds(s0, Clock::now()) * 1e3);
      }
      events_per_step = (g.AllocCount(kCpuDevice) + g.FreeCount(kCpuDevice) - events0) /
                        steps_per_round;
      if (recording) g.StopRecording();
    }
  }
  g.ClearHistory();
  const double off = Median(off_ms);
  const double on = Median(on_ms);
  std::printf("\n[step] %s\n", name);
  std::printf("  %lld alloc/free events per step; %d rounds x %d steps per mode\n",
              static_cast<long long>(events_per_step), rounds, steps_per_round);
  std::printf(
      "  median step: recording off %.3f ms, on %.3f ms, on/off = %.4f (%+.2f%%)\n", off,
      on, on / off, (on / off - 1) * 100);
  std::printf(
      "  predicted from per-event cost: %lld events x %.1f ns = %.4f ms (%+.3f%%)\n",
      static_cast<long long>(events_per_step), event_cost_ns,
      events_per_step * event_cost_ns * 1e-6,
      events_per_step * event_cost_ns * 1e-6 / off * 100);
}

// An MLP forward/backward/SGD step with the trainer's phase markers.
std::function<void()> MlpStep(int64_t in, int64_t hidden, int layers, int64_t batch) {
  torch::manual_seed(0);
  torch::nn::Sequential mlp;
  int64_t width = in;
  for (int l = 0; l < layers; ++l) {
    mlp->push_back(torch::nn::Linear(width, hidden));
    mlp->push_back(torch::nn::ReLU());
    width = hidden;
  }
  mlp->push_back(torch::nn::Linear(width, in));
  auto opt = std::make_shared<torch::optim::SGD>(mlp->parameters(),
                                                 torch::optim::SGDOptions(0.01));
  const torch::Tensor x = torch::randn({batch, in});
  const torch::Tensor y = torch::randn({batch, in});
  return [mlp, opt, x, y]() mutable {
    static int64_t step = 0;
    BeginStep(++step);
    torch::Tensor loss;
    {
      PhaseScope fwd(Phase::kForward);
      loss = torch::mse_loss(mlp->forward(x), y);
    }
    {
      PhaseScope bwd(Phase::kBackward);
      opt->zero_grad();
      loss.backward();
    }
    {
      PhaseScope o(Phase::kOptimizer);
      opt->step();
    }
    EndStep(step);
  };
}

// Step time with the op half of attribution (RecordFunction callbacks,
// memory/op_attribution.h) off and on, interleaved in rounds; module scopes,
// categories and the allocator's records are always on, as in the daemon.
void AttributionBench(const char* name, const std::function<void()>& run_step) {
  for (int i = 0; i < 5; ++i) run_step();
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) run_step();
  const double step_s = Seconds(t0, Clock::now()) / 5;
  const int rounds = 10;
  const int steps_per_round = std::max(3, static_cast<int>(0.3 / step_s));
  std::vector<double> off_ms, on_ms;
  for (int round = 0; round < rounds; ++round) {
    for (bool on : {false, true}) {
      std::optional<memprofd::memory::OpAttribution> ops;
      if (on) ops.emplace();
      for (int i = 0; i < steps_per_round; ++i) {
        const auto s0 = Clock::now();
        run_step();
        (on ? on_ms : off_ms).push_back(Seconds(s0, Clock::now()) * 1e3);
      }
    }
  }
  const double off = Median(off_ms);
  const double on = Median(on_ms);
  std::printf("\n[attribution] %s\n", name);
  std::printf("  %d rounds x %d steps per mode\n", rounds, steps_per_round);
  std::printf(
      "  median step: op attribution off %.3f ms, on %.3f ms, on/off = %.4f (%+.2f%%)\n",
      off, on, on / off, (on / off - 1) * 100);
}

// A training step of the daemon's default model: the `tiny` preset,
// batch 8 x 128 tokens of the embedded corpus, AdamW (the Trainer marks the
// phases), its parameters attributed as the session does.
std::function<void()> TinyLlamaStep() {
  auto model = std::shared_ptr<memprofd::LlamaModel>(
      *memprofd::LlamaModel::Create(*memprofd::LlamaConfig::Preset("tiny"), 0));
  memprofd::TagModelMemory(*model);
  auto trainer = std::make_shared<memprofd::Trainer>(model.get());
  auto data = std::shared_ptr<memprofd::TokenDataset>(
      *memprofd::TokenDataset::Create(memprofd::DataSpec(), 256));
  auto generator = std::make_shared<at::Generator>(memprofd::MakeDataGenerator(0));
  memprofd::TrainOptions options;
  return [model, trainer, data, generator, options] {
    if (!trainer->Step(options, *data, *generator).ok()) std::abort();
  };
}

}  // namespace

// `memory_bench --dump FILE`: records three steps of a small MLP and writes
// the memory_viz pickle, to open in pytorch.org/memory_viz.
static int DumpSample(const char* path) {
  MemoryRecorder& g = MemoryRecorder::Global();
  torch::nn::Sequential mlp(torch::nn::Linear(64, 256), torch::nn::ReLU(),
                            torch::nn::Linear(256, 64));
  torch::optim::SGD opt(mlp->parameters(), torch::optim::SGDOptions(0.01));
  if (!g.StartRecording(100000).ok()) return 1;
  for (int64_t step = 1; step <= 3; ++step) {
    BeginStep(step);
    torch::Tensor loss;
    {
      PhaseScope fwd(Phase::kForward);
      loss =
          torch::mse_loss(mlp->forward(torch::randn({16, 64})), torch::zeros({16, 64}));
    }
    {
      PhaseScope bwd(Phase::kBackward);
      opt.zero_grad();
      loss.backward();
    }
    {
      PhaseScope o(Phase::kOptimizer);
      opt.step();
    }
    EndStep(step);
  }
  const std::string pickle = memprofd::memory::CaptureMemoryVizPickle(
      memprofd::memory::MemoryRecorder::Global());
  FILE* f = std::fopen(path, "wb");
  if (f == nullptr || std::fwrite(pickle.data(), 1, pickle.size(), f) != pickle.size()) {
    std::fprintf(stderr, "cannot write %s\n", path);
    return 1;
  }
  std::fclose(f);
  std::printf("wrote %zu bytes to %s\n", pickle.size(), path);
  return 0;
}

int main(int argc, char** argv) {
  if (!memprofd::memory::InstallMemoryAccounting().ok()) {
    std::fprintf(stderr, "could not install the counting CPU allocator\n");
    return 1;
  }
  if (argc == 3 && std::string(argv[1]) == "--dump") return DumpSample(argv[2]);
  // `memory_bench --attribution`: only the per-event costs and the tiny step
  // with attribution off vs on (issue 12's figures), a few minutes.
  const bool attribution_only = argc == 2 && std::string(argv[1]) == "--attribution";
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  MemoryRecorder& g = MemoryRecorder::Global();
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::printf("memory_bench: LibTorch threads=%d, OMP_NUM_THREADS=%s, hw threads=%u\n",
              at::get_num_threads(), omp ? omp : "(unset)",
              std::thread::hardware_concurrency());

  std::printf("\n[recorder alone] ns per event (alloc or free)\n");
  for (int threads : {1, 2}) {
    const double off = RecorderNsPerEvent(false, threads);
    const double on = RecorderNsPerEvent(true, threads);
    std::printf("  %d thread(s): recording off %6.1f ns, on %6.1f ns (+%.1f ns/event)\n",
                threads, off, on, on - off);
  }

  std::printf("\n[recorder alone, attributed events] ns per event (alloc or free)\n");
  for (int threads : {1, 2}) {
    const double off = AttributedNsPerEvent(false, threads);
    const double on = AttributedNsPerEvent(true, threads);
    std::printf("  %d thread(s): recording off %6.1f ns, on %6.1f ns (+%.1f ns/event)\n",
                threads, off, on, on - off);
  }
  if (attribution_only) {
    AttributionBench("tiny Llama (the daemon's default model), batch 8 x 128, AdamW",
                     TinyLlamaStep());
    return 0;
  }

  std::printf("\n[CPU allocator] ns per alloc+free pair, 256 B and 64 KiB\n");
  for (size_t bytes : {size_t{256}, size_t{65536}}) {
    c10::Allocator* wrapper = c10::GetAllocator(c10::DeviceType::CPU);
    const double raw = AllocatorNsPerPair(c10::GetDefaultCPUAllocator(), bytes);
    g.StopRecording();
    const double off = AllocatorNsPerPair(wrapper, bytes);
    if (!g.StartRecording(100000).ok()) return 1;
    const double on = AllocatorNsPerPair(wrapper, bytes);
    g.StopRecording();
    g.ClearHistory();
    std::printf(
        "  %6zu B: default %6.1f ns, wrapper+off %6.1f ns (x%.2f), wrapper+on %6.1f ns "
        "(x%.2f)\n",
        bytes, raw, off, off / raw, on, on / raw);
  }

  AttributionBench("tiny Llama (the daemon's default model), batch 8 x 128, AdamW",
                   TinyLlamaStep());

  const double event_cost_ns = RecorderNsPerEvent(true, 1) - RecorderNsPerEvent(false, 1);
  StepBench("tiny Llama (the daemon's default model), batch 8 x 128, AdamW",
            TinyLlamaStep(), event_cost_ns);
  StepBench("wide MLP: Linear(512,2048)-ReLU-Linear(2048,512), batch 64",
            MlpStep(512, 2048, 1, 64), event_cost_ns);
  StepBench("deep MLP: 16 x (Linear(64,64)-ReLU), batch 8 (many small ops)",
            MlpStep(64, 64, 16, 8), event_cost_ns);

  // Dump cost: a full 100k-entry ring of 256-byte alloc/free pairs.
  {
    memprofd::memory::MemoryVizInput in;
    for (int i = 0; i < 100000; ++i) {
      memprofd::memory::HistoryEntry e;
      e.addr = 0x7f0000000000ull + 4096ull * static_cast<uint64_t>(i / 2 % 1000);
      e.size = 256;
      e.time_us = 1700000000000000 + i;
      e.step = i / 1000;
      e.phase = Phase::kForward;
      e.action = i % 2 == 0 ? memprofd::memory::HistoryAction::kAlloc
                            : memprofd::memory::HistoryAction::kFree;
      in.history.push_back(e);
    }
    const auto t0 = Clock::now();
    const std::string pickle = memprofd::memory::BuildMemoryVizPickle(in);
    std::printf("\n[dump] 100000-entry history -> %.1f MB pickle in %.1f ms\n",
                pickle.size() / 1e6, Seconds(t0, Clock::now()) * 1e3);
  }
  return 0;
}
