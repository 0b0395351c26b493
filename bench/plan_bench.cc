// plan_bench: the memory planner against the steps it plans.
//
// Accuracy: for the tiny and small presets, batch {1, 8}, sequence {128, 512},
// gradient checkpointing off/on, attention sdpa/eager, offloading off/on
// (to disk on the CPU, to host on a GPU), float32 and bf16 autocast (the
// plan follows the target device's autocast policy), the plan's peak
// (a dry run on the meta device) beside the measured peak of the same two
// training steps run for real on the device (calibration.h), every cell and
// the worst. On the CPU the allocator has no cache, so both count the same
// bytes; what a kernel allocates inside itself and frees before returning is
// what the plan cannot see. With offloading, "+in flight" is what the
// offloader's copies still in flight may add (MemoryPlan::
// offload_in_flight_bytes): a measured peak above the plan by up to that
// much is a slow disk or link, not an error of the plan. On the CPU each cell
// also shows the process's RSS growth while its steps run beside the plan's
// host_rss_bytes, and how many times the allocator's peak it is, with the
// heap kept near its live bytes as the daemon keeps it (or glibc's
// defaults, to compare); "run s" is the measured steps' wall time, model
// creation included. On CUDA, SDPA is planned as the
// kernel the GPU picks for the model's heads and dtype (flash, memory-efficient or math);
// each cell there also shows the simulated caching allocator's reserve beside
// torch.cuda.max_memory_reserved of the same steps (its cache emptied first).
//
// Speed: Llama-3-8B's and Llama-3-70B's shapes at 1 x 2048 planned on meta:
// seconds and the process's RSS growth.
//
// Usage: plan_bench [device=cpu|cuda] [presets=tiny,small] [shapes=1] [BxT]
//                   [dtypes=fp32,bf16] [heap=near|glibc] [repeats=1]
//                   [offload=off,on]
//   BxT (e.g. 4x512): that batch and sequence only, instead of the grid's
//   {1, 8} x {128, 512} ("grid": the grid; the GPU kit plans the 1B preset at
//   its own 4 x 512, and its dry run at 1 x 128). dtypes: the precisions of
//   the grid. heap: near (the daemon's default, --return_host_memory) or
//   glibc's defaults. repeats: each cell measured that many times (the
//   offloaded cells' peaks depend on when the copies finish: run them
//   repeatedly, with the cores busy, to see how far). offload: the grid's
//   offloading settings.
//   On CUDA (the GPU check) the plan targets CUDA (blocks rounded as the
//   caching allocator rounds them) and is compared with
//   torch.cuda.max_memory_allocated's count, read by the recorder.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "core/common/host_heap.h"
#include "core/memory/install.h"
#include "core/memory/recorder.h"
#include "core/model/config.h"
#include "core/plan/calibration.h"
#include "core/plan/planner.h"
#ifdef MEMPROFD_WITH_CUDA
#include "core/memory/cuda_stats.h"
#endif

namespace memprofd::plan {
namespace {

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// A Llama-3 shape: vocab 128256, 8 key-value heads, head_dim 128.
LlamaConfig Llama3Shape(int64_t hidden, int64_t intermediate, int64_t layers,
                        int64_t heads) {
  LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  return c;
}

// One cell of the accuracy grid.
struct Cell {
  std::string label;
  PlanSpec spec;
  bool eager = false;
  bool bf16 = false;
};

// The grid's cells, each `repeats` times in a row.
std::vector<Cell> Grid(const LlamaConfig& config, const std::string& name,
                       c10::Device device, const std::vector<int64_t>& batches,
                       const std::vector<int64_t>& seqs,
                       const std::vector<MixedPrecision>& precisions,
                       const std::vector<bool>& offloads, int repeats) {
  std::vector<Cell> cells;
  for (int64_t batch : batches) {
    for (int64_t seq : seqs) {
      for (bool ckpt : {false, true}) {
        for (AttentionImplementation attention :
             {AttentionImplementation::kSdpa, AttentionImplementation::kEager}) {
          for (bool offloaded : offloads) {
            for (MixedPrecision precision : precisions) {
              Cell cell;
              cell.spec.train.mixed_precision = precision;
              cell.bf16 = precision == MixedPrecision::kBf16;
              cell.spec.model = config;
              cell.spec.train.batch_size = batch;
              cell.spec.train.seq_len = seq;
              cell.spec.train.gradient_checkpointing = ckpt;
              cell.spec.train.attn_implementation = attention;
              cell.spec.target =
                  device.is_cuda() ? PlanSpec::Target::kCuda : PlanSpec::Target::kCpu;
              // Offloading to host on a GPU, to disk on the CPU (where host
              // moves nothing).
              cell.spec.offload.enabled = offloaded;
              cell.spec.offload.target =
                  device.is_cuda() ? offload::Target::kHost : offload::Target::kDisk;
              cell.eager = attention == AttentionImplementation::kEager;
              char label[96];
              std::snprintf(label, sizeof(label), "%-8s %5lld %5lld %5s %-6s %-7s %-5s",
                            name.c_str(), static_cast<long long>(batch),
                            static_cast<long long>(seq), ckpt ? "on" : "off",
                            std::string(AttentionImplementationName(attention)).c_str(),
                            !offloaded         ? "off"
                            : device.is_cuda() ? "host"
                                               : "disk",
                            precision == MixedPrecision::kBf16 ? "bf16" : "fp32");
              cell.label = label;
              cells.insert(cells.end(), repeats, cell);
            }
          }
        }
      }
    }
  }
  return cells;
}

int Accuracy(const std::vector<std::string>& presets, c10::Device device,
             const std::vector<int64_t>& batches, const std::vector<int64_t>& seqs,
             const std::vector<MixedPrecision>& precisions,
             const std::vector<bool>& offloads, int repeats) {
  std::printf("%-8s %5s %5s %5s %-6s %-7s %-5s %14s %14s %9s %10s %8s %7s%s\n", "preset",
              "batch", "seq", "ckpt", "attn", "offload", "dtype", "planned MiB",
              "measured MiB", "error", "+in flight", "plan s", "run s",
              device.is_cuda() ? "   reserved: planned MiB   measured MiB     error"
                               : "   RSS: planned MiB  growth MiB    error  x peak");
  double worst = 0;
  double worst_eager = 0;
  double worst_bf16 = 0;
  double worst_reserved = 0;  // CUDA only
  std::string worst_cell;
  // Cells whose measured peak exceeds the plan plus what its offloader's
  // copies in flight may add by more than 0.1% (below that: what kernels
  // allocate inside themselves, the token window), and the largest excess.
  int above_bound = 0;
  double largest_excess = 0;
  // CPU: the worst error of the planned RSS growth, and the most RSS grew
  // per byte of the allocator's peak.
  double worst_rss = 0;
  double worst_rss_ratio = 0;
  bool warmed_up = false;
  for (const std::string& name : presets) {
    absl::StatusOr<LlamaConfig> config = LlamaConfig::Preset(name);
    if (!config.ok()) {
      std::fprintf(stderr, "plan_bench: %s\n",
                   std::string(config.status().message()).c_str());
      return 2;
    }
    for (const Cell& cell :
         Grid(*config, name, device, batches, seqs, precisions, offloads, repeats)) {
      if (!warmed_up) {
        // The first run faults in the kernels' code pages, which RSS counts
        // and later runs share.
        (void)MeasureTrainingSteps(cell.spec, device, memory::MemoryRecorder::Global());
        warmed_up = true;
      }
      absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(cell.spec);
      // The resident set's growth while the steps run (VmHWM restarted
      // from the RSS before them, the heap's free pages given back first).
      ReturnFreedHostMemory();
      const bool rss_measured = ResetHostPeakResident();
      const int64_t rss_before = ReadHostResident().rss_bytes;
      const auto run_start = std::chrono::steady_clock::now();
      absl::StatusOr<std::vector<MeasuredStep>> measured =
          MeasureTrainingSteps(cell.spec, device, memory::MemoryRecorder::Global());
      const int64_t rss_growth = ReadHostResident().peak_rss_bytes - rss_before;
      const double run_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start)
              .count();
      if (!plan.ok() || !measured.ok()) {
        std::fprintf(
            stderr, "plan_bench: %s: %s\n", cell.label.c_str(),
            std::string((plan.ok() ? measured.status() : plan.status()).message())
                .c_str());
        return 1;
      }
      int64_t real = 0, real_reserved = 0;
      for (const MeasuredStep& s : *measured) {
        real = std::max(real, s.peak_allocated_bytes);
        real_reserved = std::max(real_reserved, s.peak_reserved_bytes);
      }
      const double error = static_cast<double>(plan->peak_allocated_bytes - real) /
                           static_cast<double>(real);
      std::printf("%s %14.2f %14.2f %8.3f%% %10.2f %8.3f %7.2f", cell.label.c_str(),
                  MiB(plan->peak_allocated_bytes), MiB(real), error * 100,
                  MiB(plan->offload_in_flight_bytes), plan->seconds, run_seconds);
      if (device.is_cpu() && rss_measured) {
        const double rss_error = static_cast<double>(plan->host_rss_bytes - rss_growth) /
                                 static_cast<double>(rss_growth);
        const double ratio = static_cast<double>(rss_growth) / static_cast<double>(real);
        std::printf("   %14.2f %11.2f %7.2f%% %7.2f", MiB(plan->host_rss_bytes),
                    MiB(rss_growth), rss_error * 100, ratio);
        if (std::abs(rss_error) > std::abs(worst_rss)) worst_rss = rss_error;
        worst_rss_ratio = std::max(worst_rss_ratio, ratio);
      }
      const double excess = static_cast<double>(real - plan->peak_allocated_bytes -
                                                plan->offload_in_flight_bytes) /
                            static_cast<double>(real);
      if (excess > 0.001) ++above_bound;
      largest_excess = std::max(largest_excess, excess);
      if (device.is_cuda() && real_reserved > 0) {
        // The simulated caching allocator's reserve beside the real one's.
        const double reserved_error =
            static_cast<double>(plan->reserved_bytes - real_reserved) /
            static_cast<double>(real_reserved);
        std::printf(" %14.2f %14.2f %8.3f%%", MiB(plan->reserved_bytes),
                    MiB(real_reserved), reserved_error * 100);
        if (std::abs(reserved_error) > std::abs(worst_reserved)) {
          worst_reserved = reserved_error;
        }
      }
      std::printf("\n");
      std::fflush(stdout);
      if (std::abs(error) > std::abs(worst)) {
        worst = error;
        worst_cell = cell.label;
      }
      if (cell.eager && std::abs(error) > std::abs(worst_eager)) worst_eager = error;
      if (cell.bf16 && std::abs(error) > std::abs(worst_bf16)) worst_bf16 = error;
    }
  }
  std::printf(
      "worst: %+.3f%% (%s); worst with eager attention: %+.3f%%; worst in bf16: "
      "%+.3f%%\n",
      worst * 100, worst_cell.c_str(), worst_eager * 100, worst_bf16 * 100);
  std::printf(
      "measured above planned + in flight by more than 0.1%%: %d cells (largest excess "
      "%+.3f%%)\n",
      above_bound, largest_excess * 100);
  if (device.is_cpu()) {
    std::printf(
        "worst planned RSS growth: %+.3f%%; RSS grew at most %.2fx the allocator's "
        "peak\n",
        worst_rss * 100, worst_rss_ratio);
  }
  if (device.is_cuda()) {
    std::printf("worst reserved (simulated caching allocator): %+.3f%%\n",
                worst_reserved * 100);
  }
  return 0;
}

int Speed() {
  struct Shape {
    const char* name;
    LlamaConfig config;
  };
  const std::vector<Shape> shapes = {
      {"llama-3-8b", Llama3Shape(4096, 14336, 32, 32)},
      {"llama-3-70b", Llama3Shape(8192, 28672, 80, 64)},
  };
  std::printf("\n%-12s %8s %12s %14s %14s %16s\n", "shape", "1 x T", "plan s", "peak GiB",
              "state GiB", "RSS growth MiB");
  for (const Shape& shape : shapes) {
    PlanSpec spec;
    spec.model = shape.config;
    spec.train.batch_size = 1;
    spec.train.seq_len = 2048;
    spec.train.gradient_checkpointing = true;
    spec.train.attn_implementation = AttentionImplementation::kEager;
    spec.target = PlanSpec::Target::kCuda;
    const int64_t rss_before = ReadHostResident().rss_bytes;
    absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(spec);
    const int64_t rss_after = ReadHostResident().rss_bytes;
    if (!plan.ok()) {
      std::fprintf(stderr, "plan_bench: %s: %s\n", shape.name,
                   std::string(plan.status().message()).c_str());
      return 1;
    }
    std::printf("%-12s %8d %12.2f %14.2f %14.2f %16.1f\n", shape.name, 2048,
                plan->seconds,
                static_cast<double>(plan->peak_allocated_bytes) / (1 << 30),
                static_cast<double>(plan->model_state_bytes) / (1 << 30),
                MiB(rss_after - rss_before));
  }
  return 0;
}

// A comma list of `a` and `b` as bools (true: `b`); false, saying why, for
// anything else.
bool SplitChoices(const std::string& list, const char* what, const char* a, const char* b,
                  std::vector<bool>* out) {
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    if (item != a && item != b) {
      std::fprintf(stderr, "plan_bench: %s are %s and %s, not \"%s\"\n", what, a, b,
                   std::string(item).c_str());
      return false;
    }
    out->push_back(item == b);
  }
  return true;
}

}  // namespace
}  // namespace memprofd::plan

int main(int argc, char** argv) {
  using namespace memprofd;
  const std::string device_name = argc > 1 ? argv[1] : "cpu";
  const std::vector<std::string> presets =
      absl::StrSplit(argc > 2 ? argv[2] : "tiny,small", ',', absl::SkipEmpty());
  const bool shapes = argc > 3 ? std::string(argv[3]) != "0" : true;
  std::vector<int64_t> batches = {1, 8};
  std::vector<int64_t> seqs = {128, 512};
  if (argc > 4 && std::string(argv[4]) != "grid") {
    long long b = 0, t = 0;
    if (std::sscanf(argv[4], "%lldx%lld", &b, &t) != 2 || b < 1 || t < 1) {
      std::fprintf(stderr, "plan_bench: BxT must look like 4x512, not \"%s\"\n", argv[4]);
      return 2;
    }
    batches = {b};
    seqs = {t};
  }
  std::vector<bool> bf16s;
  if (!plan::SplitChoices(argc > 5 ? argv[5] : "fp32,bf16", "dtypes", "fp32", "bf16",
                          &bf16s)) {
    return 2;
  }
  std::vector<MixedPrecision> precisions;
  for (bool bf16 : bf16s) {
    precisions.push_back(bf16 ? MixedPrecision::kBf16 : MixedPrecision::kNo);
  }
  if (absl::Status s = memory::InstallMemoryAccounting(); !s.ok()) {
    std::fprintf(stderr, "plan_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const std::string heap = argc > 6 ? argv[6] : "near";
  if (heap != "near" && heap != "glibc") {
    std::fprintf(stderr, "plan_bench: heap is near or glibc, not \"%s\"\n", heap.c_str());
    return 2;
  }
  // As the daemon keeps it by default (--return_host_memory), or glibc's
  // defaults.
  if (heap == "near" && !KeepHostHeapNearLiveBytes()) {
    std::fprintf(stderr, "plan_bench: glibc refused the heap's thresholds\n");
    return 2;
  }
  const c10::Device device(device_name);
#ifdef MEMPROFD_WITH_CUDA
  if (device.is_cuda()) (void)memory::AttachCudaAccounting();
#endif
  std::printf("plan_bench on %s, LibTorch %s, %d threads, heap %s\n",
              device.str().c_str(), TORCH_VERSION, at::get_num_threads(), heap.c_str());
  const int repeats = argc > 7 ? std::atoi(argv[7]) : 1;
  if (repeats < 1) {
    std::fprintf(stderr, "plan_bench: repeats must be >= 1\n");
    return 2;
  }
  std::vector<bool> offloads;
  if (!plan::SplitChoices(argc > 8 ? argv[8] : "off,on", "offload", "off", "on",
                          &offloads)) {
    return 2;
  }
  if (int rc =
          plan::Accuracy(presets, device, batches, seqs, precisions, offloads, repeats);
      rc != 0)
    return rc;
  return shapes ? plan::Speed() : 0;
}
