// offload_bench: the activation offloader on the built-in Llama presets.
//
// For `tiny` and `small`, with per-layer checkpointing on and off, one
// training step (forward + backward, no optimizer) with offloading off, to
// disk without and with the backward read-ahead, and to host, side by side:
// step time, backward time and the part of it spent waiting for reloads, peak
// and end-of-forward resident saved-activation bytes, bytes moved with true
// dedup against what the TRL baseline's key (storage pointer + offset, dtype) would
// have moved on the same saved tensors. Then the per-saved-tensor cost of the
// hooks.
//
// Usage: offload_bench [steps=3] [batch=4] [seq=128] [device=cpu|cuda]

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/train/checkpoint.h"

namespace memprofd::offload {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Where the model runs (argv[4]); step times wait for the device's queue.
c10::Device& ComputeDevice() {
  static c10::Device device(c10::kCPU);
  return device;
}
void Synchronize() {
  if (ComputeDevice().is_cuda()) torch::cuda::synchronize();
}

struct Result {
  double step_s = 0;
  double backward_s = 0;
  int64_t end_of_forward = 0;
  OffloadStats stats;
};

// One step; `offloader` null = no hooks at all.
Result Step(LlamaModel& model, const at::Tensor& ids, Offloader* offloader,
            bool checkpoint) {
  for (at::Tensor& p : model.Parameters()) p.mutable_grad().reset();
  std::vector<at::Tensor> filter = model.Parameters();
  for (const at::Tensor& b : model.Buffers()) filter.push_back(b);
  Result r;
  Synchronize();
  const auto start = Clock::now();
  if (offloader != nullptr) offloader->BeginStep(filter);
  at::Tensor loss;
  {
    OffloadScope scope(offloader);
    at::Tensor h = model.Embed(ids);
    for (int64_t i = 0; i < model.num_layers(); ++i) {
      h = checkpoint ? CheckpointedLayer(model, i, h) : model.Layer(i, h);
    }
    h = model.FinalNorm(h);
    NoOffloadScope head;
    const at::Tensor logits = model.Head(h);
    loss = torch::nn::functional::cross_entropy(
        logits.slice(1, 0, -1).reshape({-1, logits.size(-1)}),
        ids.slice(1, 1).reshape({-1}));
  }
  if (offloader != nullptr) r.end_of_forward = offloader->resident_saved_bytes();
  Synchronize();
  const auto backward_start = Clock::now();
  loss.backward();
  Synchronize();
  r.backward_s = Seconds(backward_start);
  if (offloader != nullptr) r.stats = offloader->EndStep();
  r.step_s = Seconds(start);
  return r;
}

std::unique_ptr<Offloader> Make(bool enabled, Target target,
                                int prefetch_depth = kPrefetchAuto) {
  OffloadOptions options;
  options.enabled = enabled;
  options.target = target;
  options.prefetch_depth = prefetch_depth;
  auto offloader = Offloader::Create(options, ComputeDevice());
  if (!offloader.ok()) {
    std::fprintf(stderr, "offload_bench: %s\n", offloader.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(offloader).value();
}

void BenchModel(const std::string& preset, int steps, int64_t batch, int64_t seq) {
  auto config = LlamaConfig::Preset(preset);
  auto model = LlamaModel::Create(*config, /*seed=*/1, ComputeDevice());
  if (!model.ok()) {
    std::fprintf(stderr, "offload_bench: %s\n", model.status().ToString().c_str());
    std::exit(1);
  }
  torch::manual_seed(2);
  const at::Tensor ids = torch::randint(0, config->vocab_size, {batch, seq}, torch::kLong)
                             .to(ComputeDevice());
  for (const bool checkpoint : {true, false}) {
    double base_s = 0;
    // The targets with the default read-ahead (none on CPU, 2 on CUDA) and
    // with the other choice (`+ra` forces 2 storages, `-ra` turns it off).
    struct Mode {
      const char* name;
      bool enabled;
      Target target;
      int prefetch_depth;
    };
    const std::vector<Mode> modes =
        ComputeDevice().is_cuda()
            ? std::vector<Mode>{{"off", false, Target::kDisk, kPrefetchAuto},
                                {"host", true, Target::kHost, kPrefetchAuto},
                                {"host-ra", true, Target::kHost, 0},
                                {"disk", true, Target::kDisk, kPrefetchAuto},
                                {"disk-ra", true, Target::kDisk, 0}}
            : std::vector<Mode>{{"off", false, Target::kDisk, kPrefetchAuto},
                                {"disk", true, Target::kDisk, kPrefetchAuto},
                                {"disk+ra", true, Target::kDisk, 2},
                                {"host", true, Target::kHost, kPrefetchAuto}};
    for (const Mode& mode : modes) {
      auto offloader = Make(mode.enabled, mode.target, mode.prefetch_depth);
      Step(**model, ids, offloader.get(), checkpoint);  // warm-up
      std::vector<double> times;
      std::vector<double> backward;
      std::vector<double> waits;
      Result last;
      for (int i = 0; i < steps; ++i) {
        last = Step(**model, ids, offloader.get(), checkpoint);
        times.push_back(last.step_s);
        backward.push_back(last.backward_s);
        waits.push_back(static_cast<double>(last.stats.reload_wait_ns) * 1e-9);
      }
      for (auto* v : {&times, &backward, &waits}) std::sort(v->begin(), v->end());
      const double median = times[times.size() / 2];
      if (!mode.enabled) base_s = median;
      std::printf(
          "%-5s ckpt=%-3s %-7s  step %8.1f ms (%+6.1f%%)  backward %8.1f ms (reload wait "
          "%6.2f ms, read ahead %7.2f MiB)  resident saved: peak %8.2f MiB, "
          "end of fwd %8.2f MiB  moved %8.2f MiB (TRL baseline %8.2f MiB)  dedup hits "
          "%lld  "
          "offloaded %lld of %lld\n",
          preset.c_str(), checkpoint ? "on" : "off", mode.name, median * 1e3,
          (median / base_s - 1) * 100, backward[backward.size() / 2] * 1e3,
          waits[waits.size() / 2] * 1e3, MiB(last.stats.bytes_prefetched),
          MiB(last.stats.peak_resident_saved_bytes), MiB(last.end_of_forward),
          MiB(last.stats.bytes_out), MiB(last.stats.trl_baseline_bytes_out),
          static_cast<long long>(last.stats.dedup_hits),
          static_cast<long long>(last.stats.tensors_offloaded),
          static_cast<long long>(last.stats.tensors_seen));
    }
  }
}

// Per-saved-tensor cost of the hooks: many tiny saved tensors (kept: below
// the threshold), with no scope, and with a scope that only accounts.
void BenchHookOverhead() {
  const int64_t n = 20000;
  at::Tensor w = torch::ones({4}, torch::requires_grad());
  auto run = [&](Offloader* offloader) {
    const auto start = Clock::now();
    if (offloader != nullptr) offloader->BeginStep({w});
    at::Tensor acc = torch::zeros({4});
    {
      OffloadScope scope(offloader);
      at::Tensor x = w * 1;
      for (int64_t i = 0; i < n; ++i) x = torch::sin(x);  // saves its input
      acc = x.sum();
    }
    acc.backward();
    if (offloader != nullptr) offloader->EndStep();
    return Seconds(start);
  };
  auto accounting = Make(false, Target::kDisk);
  auto disk = Make(true, Target::kDisk);  // 16-byte tensors: kept as small
  run(nullptr);
  double none = 1e9, counted = 1e9, small = 1e9;
  for (int i = 0; i < 3; ++i) {
    none = std::min(none, run(nullptr));
    counted = std::min(counted, run(accounting.get()));
    small = std::min(small, run(disk.get()));
  }
  std::printf(
      "hook overhead per saved tensor (pack + unpack, %lld tensors): accounting only "
      "%.0f ns, disk target kept-small %.0f ns (baseline step %.1f ms)\n",
      static_cast<long long>(n), (counted - none) / n * 1e9, (small - none) / n * 1e9,
      none * 1e3);
}

}  // namespace
}  // namespace memprofd::offload

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 3;
  const int64_t batch = argc > 2 ? std::atoll(argv[2]) : 4;
  const int64_t seq = argc > 3 ? std::atoll(argv[3]) : 128;
  if (argc > 4) memprofd::offload::ComputeDevice() = c10::Device(argv[4]);
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::printf(
      "offload_bench: LibTorch intra-op threads %d (OMP_NUM_THREADS=%s), batch %lld, "
      "seq %lld, median of %d steps, device %s\n",
      at::get_num_threads(), omp != nullptr ? omp : "unset",
      static_cast<long long>(batch), static_cast<long long>(seq), steps,
      memprofd::offload::ComputeDevice().str().c_str());
  if (memprofd::offload::InstallOffloadEngine().ok() == false) return 1;
  for (const char* preset : {"tiny", "small"}) {
    memprofd::offload::BenchModel(preset, steps, batch, seq);
  }
  memprofd::offload::BenchHookOverhead();
  return 0;
}
