// Data-parallel step time: one process against two ranks (Gloo on loopback,
// --threads each) on the built-in presets, with the all-reduce time that
// backward did not hide ("exposed": the time GradientSync::Finish waited).
// Each rank trains --batch windows, so two ranks do twice the work of one in
// each step; the scaling figure is tokens/s of 2 ranks over tokens/s of 1.
// On this 2-core machine two ranks of one thread each use both cores.
//
// Usage: dist_bench [--presets tiny,small] [--batch 4] [--seq 128]
//                   [--steps 6] [--warmup 1] [--threads 1]
// Run without RANK in the environment it is the launcher: it starts itself
// once per rank (RANK, WORLD_SIZE, MASTER_PORT set) and prints the table.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <unistd.h>

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
#include "core/dist/world.h"
#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/train/trainer.h"

namespace memprofd {
namespace {

std::map<std::string, std::string> ParseArgs(int argc, char** argv) {
  std::map<std::string, std::string> args = {
      {"presets", "tiny,small"}, {"batch", "4"},   {"seq", "128"}, {"steps", "6"},
      {"warmup", "1"},           {"threads", "1"}, {"preset", ""}};
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

// One rank: prints "RESULT <seconds per step> <exposed seconds per step>".
int RunRank(const std::map<std::string, std::string>& args) {
  at::set_num_threads(static_cast<int>(IntArg(args, "threads")));
  absl::StatusOr<WorldSpec> world = ReadWorldSpec(ProcessEnvironment());
  absl::StatusOr<LlamaConfig> config = LlamaConfig::Preset(args.at("preset"));
  if (!world.ok() || !config.ok()) {
    std::fprintf(stderr, "%s\n",
                 (!world.ok() ? world.status() : config.status()).ToString().c_str());
    return 2;
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
    absl::StatusOr<std::unique_ptr<DataParallel>> created =
        DataParallel::Create(group.get(), &trainer);
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
      return 2;
    }
    dp = std::move(*created);
  }
  TrainOptions options;
  options.batch_size = IntArg(args, "batch");
  options.seq_len = IntArg(args, "seq");
  options.steps = IntArg(args, "warmup");
  absl::StatusOr<std::unique_ptr<TokenDataset>> data =
      TokenDataset::Create(options.data, config->vocab_size);
  StepListeners listeners;
  if (dp != nullptr) listeners.push_back(dp.get());
  if (!data.ok() || !trainer.Run(options, **data, {}, {}, nullptr, listeners).ok())
    return 2;
  const int64_t steps = IntArg(args, "steps");
  at::Generator generator = MakeDataGenerator(3);
  double seconds = 0, exposed = 0;
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
    if (dp != nullptr) exposed += dp->last_step().exposed_seconds;
  }
  std::printf("RESULT %.6f %.6f\n", seconds / steps, exposed / steps);
  return 0;
}

struct Figures {
  double step_seconds = 0;
  double exposed_seconds = 0;
};

// Starts `world` copies of this binary as ranks of one run and returns rank
// 0's figures (the slowest rank sets the pace; rank 0 waits for it).
Figures Launch(const std::string& self, const std::map<std::string, std::string>& args,
               const std::string& preset, int world, int port) {
  std::string common;
  for (const char* key : {"batch", "seq", "steps", "warmup", "threads"}) {
    absl::StrAppend(&common, " --", key, " ", args.at(key));
  }
  std::string script;
  for (int r = 0; r < world; ++r) {
    absl::StrAppend(&script, "RANK=", r, " WORLD_SIZE=", world, " MASTER_PORT=", port,
                    " ", self, " --preset ", preset, common, r == 0 ? "" : " > /dev/null",
                    " & ");
  }
  absl::StrAppend(&script, "wait");
  Figures figures;
  FILE* pipe = popen(script.c_str(), "r");
  char line[256];
  while (pipe != nullptr && fgets(line, sizeof(line), pipe) != nullptr) {
    std::sscanf(line, "RESULT %lf %lf", &figures.step_seconds, &figures.exposed_seconds);
  }
  if (pipe != nullptr) pclose(pipe);
  return figures;
}

int RunLauncher(const std::map<std::string, std::string>& args) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 2;
  self[n] = '\0';
  std::printf(
      "dist_bench: 1 process vs 2 ranks (Gloo, loopback), batch %s x seq %s per rank, "
      "%s steps after %s warm-up, %s thread(s) per rank, %d cores\n",
      args.at("batch").c_str(), args.at("seq").c_str(), args.at("steps").c_str(),
      args.at("warmup").c_str(), args.at("threads").c_str(),
      static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  std::printf("%-8s %6s %12s %14s %12s %16s %9s\n", "preset", "ranks", "s/step",
              "tokens/s", "exposed s", "exposed/step", "scaling");
  const int64_t tokens = IntArg(args, "batch") * IntArg(args, "seq");
  int port = 29600 + static_cast<int>(getpid() % 2000);
  for (const std::string& preset :
       std::vector<std::string>(absl::StrSplit(args.at("presets"), ','))) {
    Figures one = Launch(self, args, preset, 1, port++);
    Figures two = Launch(self, args, preset, 2, port++);
    const double one_rate = one.step_seconds > 0 ? tokens / one.step_seconds : 0;
    const double two_rate = two.step_seconds > 0 ? 2 * tokens / two.step_seconds : 0;
    std::printf("%-8s %6d %12.4f %14.0f %12s %16s %9s\n", preset.c_str(), 1,
                one.step_seconds, one_rate, "-", "-", "1.00");
    std::printf("%-8s %6d %12.4f %14.0f %12.4f %15.1f%% %9.2f\n", preset.c_str(), 2,
                two.step_seconds, two_rate, two.exposed_seconds,
                two.step_seconds > 0 ? 100 * two.exposed_seconds / two.step_seconds : 0,
                one_rate > 0 ? two_rate / one_rate : 0);
  }
  return 0;
}

}  // namespace
}  // namespace memprofd

int main(int argc, char** argv) {
  std::map<std::string, std::string> args = memprofd::ParseArgs(argc, argv);
  if (std::getenv("RANK") != nullptr) return memprofd::RunRank(args);
  return memprofd::RunLauncher(args);
}
