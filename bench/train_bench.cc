// Training throughput of memprofd's trainer against the same model in
// Debian's Python torch, eager mode (bench/train_bench_eager.py): the
// same presets, shapes, optimizer and thread count, side by side in one run.
//
// Usage: train_bench [--presets tiny,small] [--batch 8] [--seq 128]
//                    [--warmup 2] [--steps 10] [--small_steps 4] [--threads N]
//                    [--rounds 3]
//
// --threads N calls at::set_num_threads(N) here and torch.set_num_threads(N)
// in Python; by default both keep LibTorch's default, which this prints.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/common/json.h"
#include "core/model/llama.h"
#include "core/train/trainer.h"

namespace memprofd {
namespace {

struct Figures {
  double steps_per_second = 0;
  double tokens_per_second = 0;
  double seconds = 0;
  // Process CPU time (all threads) per step: steadier than wall time on a
  // shared machine.
  double cpu_seconds_per_step = 0;
  int64_t parameters = 0;
  // Mean seconds per step in each phase.
  double forward = 0;
  double backward = 0;
  double optimizer = 0;
};

struct Args {
  std::vector<std::string> presets = {"tiny", "small"};
  int64_t batch = 8;
  int64_t seq = 128;
  int64_t warmup = 2;
  int64_t steps = 10;
  int64_t small_steps = 4;
  int64_t threads = 0;  // 0: LibTorch's default
  // C++ and Python alternate this many times per preset; the best round of
  // each counts (the machine may be shared).
  int64_t rounds = 3;
};

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "(unset)" : v;
}

absl::StatusOr<Figures> BenchCpp(const std::string& preset, const Args& args,
                                 int64_t steps) {
  absl::StatusOr<LlamaConfig> config = LlamaConfig::Preset(preset);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(*config, 0);
  if (!model.ok()) return model.status();
  Trainer trainer(model->get());
  TrainOptions o;
  o.batch_size = args.batch;
  o.seq_len = args.seq;
  o.learning_rate = 1e-3;
  o.steps = args.warmup;
  absl::StatusOr<TrainResult> warm = trainer.Run(o);
  if (!warm.ok()) return warm.status();
  o.steps = steps;
  Figures f;
  const std::clock_t cpu_start = std::clock();
  absl::StatusOr<TrainResult> r = trainer.Run(o, [&](const StepReport& s) {
    f.forward += s.forward_seconds / steps;
    f.backward += s.backward_seconds / steps;
    f.optimizer += s.optimizer_seconds / steps;
  });
  if (!r.ok()) return r.status();
  f.cpu_seconds_per_step =
      static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC / steps;
  f.seconds = r->seconds;
  f.steps_per_second = r->steps_completed / r->seconds;
  f.tokens_per_second = r->mean_tokens_per_second;
  f.parameters = (*model)->NumParameters();
  return f;
}

// Runs the Python baseline for one preset; returns its figures and fills
// *header with its thread settings line.
absl::StatusOr<Figures> BenchPython(const std::string& preset, const Args& args,
                                    int64_t steps, std::string* header) {
  std::string cmd = absl::StrCat(
      MEMPROFD_PYTHON " " MEMPROFD_SOURCE_DIR "/bench/train_bench_eager.py --preset ",
      preset, " --batch ", args.batch, " --seq ", args.seq, " --warmup ", args.warmup,
      " --steps ", steps, " --threads ", at::get_num_threads());
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", cmd));
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  if (pclose(pipe) != 0)
    return absl::InternalError(absl::StrCat("failed: ", cmd, "\n", out));
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  if (lines.size() < 2) return absl::InternalError(absl::StrCat("short output: ", out));
  *header = lines[0];
  absl::StatusOr<Json> j = ParseJson(lines[1]);
  if (!j.ok()) return j.status();
  Figures f;
  const std::pair<const char*, double*> numbers[] = {
      {"seconds", &f.seconds},
      {"cpu_seconds_per_step", &f.cpu_seconds_per_step},
      {"steps_per_second", &f.steps_per_second},
      {"tokens_per_second", &f.tokens_per_second},
      {"forward_seconds", &f.forward},
      {"backward_seconds", &f.backward},
      {"optimizer_seconds", &f.optimizer}};
  for (const auto& [key, out] : numbers) {
    const Json* v = JsonFind(*j, key);
    if (v == nullptr || !v->is_number()) {
      return absl::InternalError(absl::StrCat("no number \"", key, "\" in: ", lines[1]));
    }
    *out = v->get<double>();
  }
  const Json* parameters = JsonFind(*j, "parameters");
  if (parameters == nullptr || !JsonToInt64(*parameters, &f.parameters)) {
    return absl::InternalError(absl::StrCat("no integer \"parameters\" in: ", lines[1]));
  }
  return f;
}

bool ParseArgs(int argc, char** argv, Args* args) {
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    std::string value = argv[i + 1];
    int64_t* target = flag == "--batch"         ? &args->batch
                      : flag == "--seq"         ? &args->seq
                      : flag == "--warmup"      ? &args->warmup
                      : flag == "--steps"       ? &args->steps
                      : flag == "--small_steps" ? &args->small_steps
                      : flag == "--threads"     ? &args->threads
                      : flag == "--rounds"      ? &args->rounds
                                                : nullptr;
    if (flag == "--presets") {
      args->presets = absl::StrSplit(value, ',', absl::SkipEmpty());
    } else if (target == nullptr || !absl::SimpleAtoi(value, target) || *target < 0) {
      std::fprintf(stderr, "bad flag %s %s\n", flag.c_str(), value.c_str());
      return false;
    }
  }
  return (argc % 2) == 1;
}

int Main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: train_bench [--presets tiny,small] [--batch 8] [--seq 128] "
                 "[--warmup 2] [--steps 10] [--small_steps 4] [--threads N] "
                 "[--rounds 3]\n");
    return 2;
  }
  if (args.threads > 0) at::set_num_threads(static_cast<int>(args.threads));
  std::printf("train_bench: batch %ld x seq %ld, %ld warm-up steps, best of %ld rounds\n",
              args.batch, args.seq, args.warmup, args.rounds);
  std::printf(
      "C++ (LibTorch): at::get_num_threads()=%d at::get_num_interop_threads()=%d\n",
      at::get_num_threads(), static_cast<int>(at::get_num_interop_threads()));
  std::printf("env: OMP_NUM_THREADS=%s OPENBLAS_NUM_THREADS=%s MKL_NUM_THREADS=%s\n",
              Env("OMP_NUM_THREADS"), Env("OPENBLAS_NUM_THREADS"),
              Env("MKL_NUM_THREADS"));
  std::printf("%-6s %10s %6s | %10s %10s | %10s %10s | %s\n", "preset", "params", "steps",
              "C++ st/s", "C++ tok/s", "py st/s", "py tok/s", "step time C++/py");
  std::string header;
  int failures = 0;
  for (const std::string& preset : args.presets) {
    const int64_t steps = preset == "small" ? args.small_steps : args.steps;
    absl::StatusOr<Figures> cpp, py;
    double cpp_cpu = 1e30, py_cpu = 1e30;  // the least CPU time per step seen
    for (int64_t round = 0; round < std::max<int64_t>(args.rounds, 1); ++round) {
      absl::StatusOr<Figures> c = BenchCpp(preset, args, steps);
      absl::StatusOr<Figures> p = BenchPython(preset, args, steps, &header);
      if (!c.ok() || !p.ok()) {
        cpp = c;
        py = p;
        break;
      }
      cpp_cpu = std::min(cpp_cpu, c->cpu_seconds_per_step);
      py_cpu = std::min(py_cpu, p->cpu_seconds_per_step);
      if (!cpp.ok() || c->steps_per_second > cpp->steps_per_second) cpp = c;
      if (!py.ok() || p->steps_per_second > py->steps_per_second) py = p;
    }
    if (!cpp.ok() || !py.ok()) {
      std::printf("%-6s failed: %s\n", preset.c_str(),
                  (!cpp.ok() ? cpp.status() : py.status()).ToString().c_str());
      ++failures;
      continue;
    }
    std::printf("%-6s %10ld %6ld | %10.2f %10.0f | %10.2f %10.0f | %.3f\n",
                preset.c_str(), cpp->parameters, steps, cpp->steps_per_second,
                cpp->tokens_per_second, py->steps_per_second, py->tokens_per_second,
                py->steps_per_second / cpp->steps_per_second);
    std::printf(
        "       per step, C++: forward %.4f s, backward %.4f s, optimizer %.4f s;"
        " Python: %.4f, %.4f, %.4f\n"
        "       CPU time per step (all threads): C++ %.4f s, Python %.4f s, ratio %.3f\n",
        cpp->forward, cpp->backward, cpp->optimizer, py->forward, py->backward,
        py->optimizer, cpp_cpu, py_cpu, cpp_cpu / py_cpu);
    std::fflush(stdout);
  }
  std::printf("Python eager: %s\n", header.c_str());
  std::printf(
      "(ratio = C++ step time / Python step time; <= 1.0 means the daemon is no "
      "slower)\n");
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace memprofd

int main(int argc, char** argv) { return memprofd::Main(argc, argv); }
