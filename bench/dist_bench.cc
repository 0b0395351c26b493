// Data-parallel step time and memory per rank, for each sharding level
// (--shardings none,optimizer,gradients,full) at each world size (--ranks 1,2,4;
// Gloo on loopback, --threads each) on the built-in presets, side by side
// with one process's. Per row: seconds per step, tokens/s, the collective
// time compute did not hide ("exposed": the time GradientSync waited, and
// with full sharding the time the parameter all-gathers waited), and
// the bytes one rank holds of parameters between steps, of whole
// parameters gathered at once in a step (full sharding's working set), of
// gradients at their peak and of AdamW's state, each the largest over the
// ranks, with parameters, gradients and state as a fraction of one process's;
// then every CPU byte a rank held at the load's peak (the model made, whole on
// every rank, and cut into the rank's part) and after the run (ended as the
// daemon ends one: full sharding keeps the model sharded), and full
// sharding's parameter all-gathers in a step.
// Measured, not derived: the parameters' storages (with full sharding, whose
// parameters are freed between steps, the rank's shards) and the optimizer
// state's tensors summed after the run, the gathered peak as
// ParameterSharding counts it, the gradients' peak as GradientSync samples it
// inside backward (the distinct storages of the .grads, the buckets' buffers
// and the pieces' sums) or, in one process, the .grads summed after backward. Each rank
// trains --batch windows, so N ranks do N times the work of one in each step; the scaling
// figure is tokens/s of N ranks over tokens/s of 1. On this 2-core machine more than two
// one-thread ranks share the cores, so the times at 4 ranks measure contention, not
// scaling; the bytes do not depend on it. Buckets are 1 MiB by default (the daemon's are
// 25 MB): with gradient sharding a rank holds its share plus a few buckets (in flight,
// being flattened, being filled), so on models this small the buckets must
// be small for the share to show.
//
// Usage: dist_bench [--presets tiny,small] [--shardings none,optimizer,gradients,full]
//                   [--ranks 1,2,4] [--batch 2] [--seq 64] [--steps 3]
//                   [--warmup 1] [--threads 1] [--bucket_kb 1024]
// Run without RANK in the environment it is the launcher: it starts itself
// once per rank (RANK, WORLD_SIZE, MASTER_PORT set) and prints the table.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/dist/data_parallel.h"
#include "core/dist/process_group.h"
#include "core/dist/sharding.h"
#include "core/dist/world.h"
#include "core/memory/install.h"
#include "core/memory/recorder.h"
#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/train/adamw.h"
#include "core/train/trainer.h"
#include "tests/testing/train.h"

namespace memprofd {
namespace {

using testing::CheckAndRun;
using testing::Request;

std::map<std::string, std::string> ParseArgs(int argc, char** argv) {
  std::map<std::string, std::string> args = {
      {"presets", "tiny,small"},
      {"shardings", "none,optimizer,gradients,full"},
      {"ranks", "1,2,4"},
      {"batch", "2"},
      {"seq", "64"},
      {"steps", "3"},
      {"warmup", "1"},
      {"threads", "1"},
      {"bucket_kb", "1024"},
      {"preset", ""},
      {"sharding", "none"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string key = argv[i];
    if (key.rfind("--", 0) == 0) args[key.substr(2)] = argv[i + 1];
  }
  return args;
}

int64_t IntArg(const std::map<std::string, std::string>& args, const std::string& key) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(args.at(key), &value)) {
    std::fprintf(stderr, "--%s must be an integer\n", key.c_str());
    std::exit(2);
  }
  return value;
}

// The bytes of the distinct storages of `tensors` (undefined ones skipped).
int64_t StorageBytes(const std::vector<at::Tensor>& tensors) {
  std::vector<const void*> seen;
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const void* storage = t.storage().unsafeGetStorageImpl();
    if (std::find(seen.begin(), seen.end(), storage) != seen.end()) continue;
    seen.push_back(storage);
    bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  return bytes;
}

// The gradients a rank holds after backward and at the update (after
// DataParallel's, which drops or shards them), the most over the steps.
class GradientBytesListener : public StepListener {
 public:
  explicit GradientBytesListener(Trainer* trainer)
      : trainer_(trainer), model_(trainer->model()) {}
  absl::Status AfterBackward() override {
    Sample();
    return absl::OkStatus();
  }
  void BeforeUpdate() override { Sample(); }
  int64_t peak() const { return peak_; }

 private:
  void Sample() {
    // The parameters' .grads and, sharded, their pieces'.
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : model_->Parameters()) {
      grads.push_back(p.grad());
      const at::Tensor target = trainer_->optimizer()->TargetOf(p);
      if (target.defined() && !target.is_same(p)) grads.push_back(target.grad());
    }
    peak_ = std::max(peak_, StorageBytes(grads));
  }
  Trainer* const trainer_;
  LlamaModel* const model_;
  int64_t peak_ = 0;
};

// One rank: prints "RESULT <rank> <seconds per step> <exposed seconds per
// step> <parameter bytes> <gradient peak bytes> <optimizer state bytes>
// <gathered parameter peak bytes> <load peak bytes> <bytes after the run>
// <parameter all-gathers in the last step>".
int RunRank(const std::map<std::string, std::string>& args) {
  at::set_num_threads(static_cast<int>(IntArg(args, "threads")));
  // Every CPU storage counted from here: the load's peak and what stays.
  if (absl::Status s = memory::InstallMemoryAccounting(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  memory::MemoryRecorder& recorder = memory::MemoryRecorder::Global();
  const int64_t base = recorder.CurrentBytes(memory::kCpuDevice);
  absl::StatusOr<WorldSpec> world = ReadWorldSpec(ProcessEnvironment());
  absl::StatusOr<LlamaConfig> config = LlamaConfig::Preset(args.at("preset"));
  absl::StatusOr<Sharding> sharding = ParseSharding(args.at("sharding"));
  for (const absl::Status& s : {world.status(), config.status(), sharding.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 2;
    }
  }
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(*config, 1);
  if (!model.ok()) return 2;
  Trainer trainer(model->get());
  std::unique_ptr<ProcessGroup> group;
  std::unique_ptr<DataParallel> dp;
  if (world->distributed()) {
    absl::StatusOr<std::unique_ptr<ProcessGroup>> connected =
        ProcessGroup::Connect(*world, ProcessGroupOptions());
    if (!connected.ok()) {
      std::fprintf(stderr, "%s\n", connected.status().ToString().c_str());
      return 2;
    }
    group = std::move(*connected);
    DataParallelOptions dp_options;
    dp_options.sharding = *sharding;
    dp_options.bucket_bytes = IntArg(args, "bucket_kb") * 1024;
    absl::StatusOr<std::unique_ptr<DataParallel>> created =
        DataParallel::Create(group.get(), &trainer, dp_options);
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
      return 2;
    }
    dp = std::move(*created);
  }
  // The load: the model made (every rank makes it whole) and, sharded, cut
  // into this rank's part.
  const int64_t load_peak = recorder.PeakBytes(memory::kCpuDevice) - base;
  TrainOptions options;
  options.batch_size = IntArg(args, "batch");
  options.seq_len = IntArg(args, "seq");
  options.steps = IntArg(args, "warmup");
  absl::StatusOr<std::unique_ptr<TokenDataset>> data =
      TokenDataset::Create(options.data, config->vocab_size);
  GradientBytesListener grad_bytes(&trainer);
  StepListeners listeners;
  if (dp != nullptr) listeners.push_back(dp.get());
  listeners.push_back(&grad_bytes);
  if (!data.ok() ||
      !CheckAndRun(trainer, options, Request({}, {}, listeners, &**data)).ok())
    return 2;
  const int64_t steps = IntArg(args, "steps");
  at::Generator generator = MakeDataGenerator(3);
  double seconds = 0, exposed = 0;
  int64_t grad_peak = grad_bytes.peak();
  int64_t gathered_peak = 0;
  int64_t gathers = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<StepReport> report =
        trainer.Step(options, **data, generator, listeners);
    seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!report.ok()) {
      std::fprintf(stderr, "%s\n", report.status().ToString().c_str());
      return 2;
    }
    if (dp != nullptr) {
      exposed += dp->last_step().exposed_seconds;
      grad_peak = std::max(grad_peak, dp->last_step().peak_bytes);
      if (const ParameterShardingStats* p = dp->parameter_stats()) {
        gathered_peak = std::max(gathered_peak, p->peak_gathered_bytes);
        exposed += p->exposed_seconds;
        gathers = p->gathers;
      }
    }
  }
  grad_peak = std::max(grad_peak, grad_bytes.peak());
  std::vector<at::Tensor> state;
  for (const auto& [name, t] : trainer.NamedOptimizerState()) state.push_back(t);
  // Full sharding: the parameters' storages are freed between steps, and
  // the rank keeps its shards.
  int64_t parameter_bytes = StorageBytes((*model)->Parameters());
  if (dp != nullptr && dp->parameter_stats() != nullptr) {
    parameter_bytes += dp->parameter_stats()->owned_bytes;
  }
  // The end of a run, as the daemon ends one (full sharding keeps the model
  // sharded; the other levels hold it whole all along): what the rank holds
  // then, its data included.
  const int64_t after = recorder.CurrentBytes(memory::kCpuDevice) - base;
  std::printf("RESULT %d %.6f %.6f %lld %lld %lld %lld %lld %lld %lld\n", world->rank,
              seconds / steps, exposed / steps, static_cast<long long>(parameter_bytes),
              static_cast<long long>(grad_peak),
              static_cast<long long>(StorageBytes(state)),
              static_cast<long long>(gathered_peak), static_cast<long long>(load_peak),
              static_cast<long long>(after), static_cast<long long>(gathers));
  std::fflush(stdout);
  return 0;
}

struct Figures {
  bool ok = false;
  double step_seconds = 0;      // the slowest rank's
  double exposed_seconds = 0;   // the most any rank waited
  int64_t parameter_bytes = 0;  // each the largest over the ranks
  int64_t gathered_peak_bytes = 0;
  int64_t gradient_peak_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t load_peak_bytes = 0;
  int64_t after_run_bytes = 0;
  int64_t gathers = 0;  // full sharding's all-gathers in a step
};

// Starts `world` copies of this binary as ranks of one run and gathers
// their figures.
Figures Launch(const std::string& self, const std::map<std::string, std::string>& args,
               const std::string& preset, const std::string& sharding, int world,
               int port) {
  std::string common;
  for (const char* key : {"batch", "seq", "steps", "warmup", "threads", "bucket_kb"}) {
    absl::StrAppend(&common, " --", key, " ", args.at(key));
  }
  std::string script;
  for (int r = 0; r < world; ++r) {
    absl::StrAppend(&script, "RANK=", r, " WORLD_SIZE=", world, " MASTER_PORT=", port,
                    " ", self, " --preset ", preset, " --sharding ", sharding, common,
                    " 2>&1 & ");
  }
  absl::StrAppend(&script, "wait");
  Figures figures;
  int reported = 0;
  std::string other_output;  // the ranks' logs, shown when one fails
  FILE* pipe = popen(script.c_str(), "r");
  char line[512];
  while (pipe != nullptr && fgets(line, sizeof(line), pipe) != nullptr) {
    int rank = 0;
    double step = 0, exposed = 0;
    long long params = 0, grads = 0, state = 0, gathered = 0, load = 0, after = 0,
              gathers = 0;
    if (std::sscanf(line, "RESULT %d %lf %lf %lld %lld %lld %lld %lld %lld %lld", &rank,
                    &step, &exposed, &params, &grads, &state, &gathered, &load, &after,
                    &gathers) != 10) {
      other_output += line;
      continue;
    }
    ++reported;
    figures.step_seconds = std::max(figures.step_seconds, step);
    figures.exposed_seconds = std::max(figures.exposed_seconds, exposed);
    figures.parameter_bytes = std::max<int64_t>(figures.parameter_bytes, params);
    figures.gathered_peak_bytes =
        std::max<int64_t>(figures.gathered_peak_bytes, gathered);
    figures.gradient_peak_bytes = std::max<int64_t>(figures.gradient_peak_bytes, grads);
    figures.optimizer_bytes = std::max<int64_t>(figures.optimizer_bytes, state);
    figures.load_peak_bytes = std::max<int64_t>(figures.load_peak_bytes, load);
    figures.after_run_bytes = std::max<int64_t>(figures.after_run_bytes, after);
    figures.gathers = std::max<int64_t>(figures.gathers, gathers);
  }
  if (pipe != nullptr) pclose(pipe);
  figures.ok = reported == world;
  if (!figures.ok) std::fputs(other_output.c_str(), stderr);
  return figures;
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::vector<std::string> List(const std::map<std::string, std::string>& args,
                              const std::string& key) {
  return absl::StrSplit(args.at(key), ',', absl::SkipEmpty());
}

int RunLauncher(const std::map<std::string, std::string>& args) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 2;
  self[n] = '\0';
  std::vector<int> rank_counts;
  for (const std::string& r : List(args, "ranks")) {
    int count = 0;
    if (!absl::SimpleAtoi(r, &count) || count < 1) {
      std::fprintf(stderr, "--ranks takes positive integers, got %s\n", r.c_str());
      return 2;
    }
    rank_counts.push_back(count);
  }
  for (const std::string& level : List(args, "shardings")) {
    absl::StatusOr<Sharding> parsed = ParseSharding(level);
    if (!parsed.ok()) {
      std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
      return 2;
    }
  }
  std::printf(
      "dist_bench: ranks over Gloo on loopback, batch %s x seq %s per rank, %s steps "
      "after %s warm-up, %s thread(s) per rank, buckets of %s KiB, %d cores\n",
      args.at("batch").c_str(), args.at("seq").c_str(), args.at("steps").c_str(),
      args.at("warmup").c_str(), args.at("threads").c_str(), args.at("bucket_kb").c_str(),
      static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  std::printf(
      "%-6s %-9s %5s %8s %9s %9s %8s %11s %8s %12s %11s %8s %11s %8s %7s %9s %9s %7s\n",
      "preset", "sharding", "ranks", "s/step", "tokens/s", "exposed", "exp/step",
      "params MiB", "params/1", "gathered MiB", "grads MiB", "grads/1", "optim MiB",
      "optim/1", "scaling", "load MiB", "after MiB", "gathers");
  const int64_t tokens = IntArg(args, "batch") * IntArg(args, "seq");
  int port = 29600 + static_cast<int>(getpid() % 2000);
  int failures = 0;
  for (const std::string& preset : List(args, "presets")) {
    // One process is every level's baseline (nothing to shard).
    const Figures one = Launch(self, args, preset, "none", 1, port++);
    if (!one.ok) {
      std::printf("%-6s one process failed\n", preset.c_str());
      ++failures;
      continue;
    }
    const double one_rate = one.step_seconds > 0 ? tokens / one.step_seconds : 0;
    auto row = [&](const std::string& level, int world, const Figures& f) {
      const double rate = f.step_seconds > 0 ? world * tokens / f.step_seconds : 0;
      std::printf(
          "%-6s %-9s %5d %8.4f %9.0f %9.4f %7.1f%% %11.2f %8.2f %12.2f %11.2f %8.2f "
          "%11.2f "
          "%8.2f %7.2f %9.2f %9.2f %7lld\n",
          preset.c_str(), level.c_str(), world, f.step_seconds, rate, f.exposed_seconds,
          f.step_seconds > 0 ? 100 * f.exposed_seconds / f.step_seconds : 0,
          MiB(f.parameter_bytes),
          one.parameter_bytes > 0
              ? static_cast<double>(f.parameter_bytes) / one.parameter_bytes
              : 0,
          MiB(f.gathered_peak_bytes), MiB(f.gradient_peak_bytes),
          one.gradient_peak_bytes > 0
              ? static_cast<double>(f.gradient_peak_bytes) / one.gradient_peak_bytes
              : 0,
          MiB(f.optimizer_bytes),
          one.optimizer_bytes > 0
              ? static_cast<double>(f.optimizer_bytes) / one.optimizer_bytes
              : 0,
          one_rate > 0 ? rate / one_rate : 0, MiB(f.load_peak_bytes),
          MiB(f.after_run_bytes), static_cast<long long>(f.gathers));
      std::fflush(stdout);
    };
    row("-", 1, one);
    for (const std::string& level : List(args, "shardings")) {
      for (int world : rank_counts) {
        if (world == 1) continue;
        const Figures f = Launch(self, args, preset, level, world, port++);
        if (!f.ok) {
          std::printf("%-6s %-9s %5d failed\n", preset.c_str(), level.c_str(), world);
          ++failures;
          continue;
        }
        row(level, world, f);
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace memprofd

int main(int argc, char** argv) {
  std::map<std::string, std::string> args = memprofd::ParseArgs(argc, argv);
  if (std::getenv("RANK") != nullptr) return memprofd::RunRank(args);
  return memprofd::RunLauncher(args);
}
