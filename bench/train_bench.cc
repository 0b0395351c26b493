// Training throughput, model FLOP utilisation and saved-activation bytes of
// memprofd's trainer with attention "eager" vs "sdpa" in float32, and "sdpa"
// under bf16 autocast (float32 master weights), side by side with the PyTorch
// reference: transformers' LlamaForCausalLM built from the same config.json
// (LlamaConfig::ToJson), float32 weights, torch.optim.AdamW(fused=True) with
// the same parameter groups, the bf16 variant's forward under
// torch.autocast(dtype=torch.bfloat16) (bench/train_bench_torch.py). Same
// presets, shapes and thread count on both sides, in one run. MFU is against
// the float32 matmul peak for every variant (bf16's own peak is not
// measured), so for bf16 it says how the step time compares, not how close
// to the bf16 hardware peak it runs.
//
// Model FLOPs per step (PaLM, appendix B), for tokens = batch * seq:
//   tokens * (6 * N + 12 * L * hidden * seq)
// where N counts the weights every token multiplies by: the decoder layers'
// q/k/v/o and gate/up/down projections plus the lm_head ([vocab, hidden],
// counted although tied to the embedding, since the head's matmul runs); the
// embedding lookup and the RMSNorm weights are left out. The attention term
// counts the full T x T scores (forward QK^T and AV, times three for forward
// plus backward), not the causal half. MFU = (FLOPs / step time) / peak,
// where peak is the best float32 at::mm of two --peak_n square matrices over
// --peak_reps calls, measured here with the same thread count before and
// after the training runs (the larger counts: on a shared machine one
// measurement may fall under another's load).
//
// Saved-activation bytes: one extra, untimed step per implementation under an
// offloader with enabled=false, wired as the session wires it (body and head
// scopes): its peak of resident saved bytes (distinct non-parameter storages
// kept for backward). The offload engine is installed first, as in the
// daemon, so every timed backward runs on it.
//
// Presets: the daemon's built-in ones (tiny, small, ...) and vocab128k, this
// benchmark's own: Llama 3's vocabulary (128,256 ids, tied head) on hidden
// 512, intermediate 1536, 4 layers of 8 heads over 4 key-value heads, where
// the head and the loss are most of the step (N: 65.7 M of the head's,
// 12.6 M of the layers'), so that the loss's cost shows (memprofd's fused
// chunked loss against transformers' materialized logits). Not in the
// default list: `--presets vocab128k`. Every preset but tiny runs
// --small_steps steps.
//
// LoRA (--lora R): both sides freeze the base and train adapters of rank R,
// lora_alpha 2R, on every projection (q/k/v/o, gate/up/down): memprofd's
// lora_r / lora_targets all-linear against peft's get_peft_model with the
// same LoraConfig (lora_dropout 0), AdamW over the adapters alone. Model
// FLOPs then count 4 * N per token (forward, and backward to the inputs:
// the frozen weights get no gradient), the adapters' own left out.
//
// Usage: train_bench [--presets tiny,small] [--batch 8] [--seq 128]
//                    [--warmup 1] [--steps 4] [--small_steps 2] [--threads N]
//                    [--rounds 2] [--peak_n 2048] [--peak_reps 5] [--lora R]
//
// --threads N calls at::set_num_threads(N) here and torch.set_num_threads(N)
// in Python; by default Python gets LibTorch's default here, which this prints.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/common/json.h"
#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/offload/step_listener.h"
#include "core/train/trainer.h"
#include "tests/testing/train.h"

namespace memprofd {
namespace {

using testing::CheckAndRun;
using testing::Request;

// What each side runs, in this order (the tables' rows per preset).
struct Variant {
  AttentionImplementation attention;
  MixedPrecision precision;
};
constexpr Variant kVariants[] = {
    {AttentionImplementation::kEager, MixedPrecision::kNo},
    {AttentionImplementation::kSdpa, MixedPrecision::kNo},
    {AttentionImplementation::kSdpa, MixedPrecision::kBf16},
};
constexpr size_t kNumVariants = std::size(kVariants);

// "eager", "sdpa", "sdpa:bf16" (the Python side's --attn spelling).
std::string VariantName(const Variant& v) {
  return v.precision == MixedPrecision::kNo
             ? std::string(AttentionImplementationName(v.attention))
             : absl::StrCat(AttentionImplementationName(v.attention), ":",
                            MixedPrecisionName(v.precision));
}

struct Figures {
  double steps_per_second = 0;
  double tokens_per_second = 0;
  // Process CPU time (all threads) per step: steadier than wall time on a
  // shared machine.
  double cpu_seconds_per_step = 0;
  // Mean seconds per step in each phase.
  double forward = 0;
  double backward = 0;
  double optimizer = 0;
  int64_t saved_bytes = 0;
  std::string optimizer_kind = "FusedAdamW";
};

struct Args {
  std::vector<std::string> presets = {"tiny", "small"};
  int64_t batch = 8;
  int64_t seq = 128;
  int64_t warmup = 1;
  int64_t steps = 4;
  int64_t small_steps = 2;
  int64_t threads = 0;  // 0: LibTorch's default
  // C++ and Python alternate this many times per preset; the best round of
  // each counts (the machine may be shared).
  int64_t rounds = 2;
  int64_t peak_n = 2048;
  int64_t peak_reps = 5;
  int64_t lora = 0;  // LoRA rank; 0: every parameter trains
};

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "(unset)" : v;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// The best float32 matmul rate, FLOP/s: 2 n^3 per n x n product.
double PeakMatmulFlops(int64_t n, int64_t reps) {
  const at::Tensor a = at::randn({n, n});
  const at::Tensor b = at::randn({n, n});
  at::Tensor c = at::mm(a, b);  // warm-up
  double best = 1e30;
  for (int64_t i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    best = std::min(best, Seconds(start));
  }
  return 2.0 * static_cast<double>(n) * n * n / best;
}

// N of the header comment: layer projections plus the lm_head.
int64_t MatmulParameters(const LlamaModel& model) {
  int64_t n = model.config().vocab_size * model.config().hidden_size;
  for (int64_t i = 0; i < model.num_layers(); ++i) {
    for (const at::Tensor& w : model.LayerParameters(i)) {
      if (w.dim() >= 2) n += w.numel();
    }
  }
  return n;
}

double FlopsPerStep(const LlamaConfig& c, int64_t n, const Args& args) {
  const double tokens = static_cast<double>(args.batch) * args.seq;
  const double per_weight = args.lora > 0 ? 4.0 : 6.0;  // LoRA: no weight gradients
  return tokens *
         (per_weight * n + 12.0 * c.num_hidden_layers * c.hidden_size * args.seq);
}

TrainOptions Options(const Args& args, const Variant& variant, int64_t steps) {
  TrainOptions o;
  o.batch_size = args.batch;
  o.seq_len = args.seq;
  o.learning_rate = 1e-3;
  o.attn_implementation = variant.attention;
  o.mixed_precision = variant.precision;
  o.steps = steps;
  if (args.lora > 0) {
    o.lora.r = args.lora;
    o.lora.alpha = 2.0 * static_cast<double>(args.lora);
    o.lora.target_modules = {"all-linear"};
  }
  return o;
}

// A built-in preset, or vocab128k (the header comment).
absl::StatusOr<LlamaConfig> BenchConfig(const std::string& preset) {
  if (preset != "vocab128k") return LlamaConfig::Preset(preset);
  LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden_size = 512;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.max_position_embeddings = 2048;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.tie_word_embeddings = true;
  return c;
}

// One untimed step under a disabled offloader: its peak resident saved bytes.
absl::StatusOr<int64_t> SavedBytesCpp(LlamaModel* model, Trainer& trainer,
                                      const TrainOptions& options) {
  offload::OffloadOptions off;
  off.enabled = false;
  absl::StatusOr<std::unique_ptr<offload::Offloader>> created =
      offload::Offloader::Create(off, model->device());
  if (!created.ok()) return created.status();
  offload::Offloader* offloader = created->get();
  offload::OffloadStepListener listener(offloader, model);
  TrainOptions one = options;
  one.steps = 1;
  absl::StatusOr<TrainResult> r = CheckAndRun(trainer, one, Request({}, {}, {&listener}));
  if (!r.ok()) return r.status();
  return listener.last_step().peak_resident_saved_bytes;
}

absl::StatusOr<Figures> BenchCpp(const LlamaConfig& config, const Args& args,
                                 const Variant& variant, int64_t steps) {
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(config, 0);
  if (!model.ok()) return model.status();
  Trainer trainer(model->get());
  absl::StatusOr<TrainResult> warm =
      CheckAndRun(trainer, Options(args, variant, args.warmup));
  if (!warm.ok()) return warm.status();
  Figures f;
  const std::clock_t cpu_start = std::clock();
  absl::StatusOr<TrainResult> r = CheckAndRun(
      trainer, Options(args, variant, steps), Request([&](const StepReport& s) {
        f.forward += s.forward_seconds / steps;
        f.backward += s.backward_seconds / steps;
        f.optimizer += s.optimizer_seconds / steps;
      }));
  if (!r.ok()) return r.status();
  f.cpu_seconds_per_step =
      static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC / steps;
  f.steps_per_second = r->steps_completed / r->seconds;
  f.tokens_per_second = r->mean_tokens_per_second;
  absl::StatusOr<int64_t> saved =
      SavedBytesCpp(model->get(), trainer, Options(args, variant, 1));
  if (!saved.ok()) return saved.status();
  f.saved_bytes = *saved;
  return f;
}

absl::StatusOr<Figures> ParseTorchFigures(const std::string& line) {
  absl::StatusOr<Json> j = ParseJson(line);
  if (!j.ok()) return j.status();
  Figures f;
  const std::pair<const char*, double*> numbers[] = {
      {"cpu_seconds_per_step", &f.cpu_seconds_per_step},
      {"steps_per_second", &f.steps_per_second},
      {"tokens_per_second", &f.tokens_per_second},
      {"forward_seconds", &f.forward},
      {"backward_seconds", &f.backward},
      {"optimizer_seconds", &f.optimizer}};
  for (const auto& [key, out] : numbers) {
    const Json* v = JsonFind(*j, key);
    if (v == nullptr || !v->is_number()) {
      return absl::InternalError(absl::StrCat("no number \"", key, "\" in: ", line));
    }
    *out = v->get<double>();
  }
  const Json* saved = JsonFind(*j, "saved_bytes");
  if (saved == nullptr || !JsonToInt64(*saved, &f.saved_bytes)) {
    return absl::InternalError(absl::StrCat("no integer \"saved_bytes\" in: ", line));
  }
  const Json* kind = JsonFind(*j, "optimizer");
  if (kind == nullptr || !kind->is_string()) {
    return absl::InternalError(absl::StrCat("no string \"optimizer\" in: ", line));
  }
  f.optimizer_kind = absl::StrCat("AdamW(", kind->get<std::string>(), ")");
  return f;
}

// Runs the PyTorch reference for one preset (every variant, in kVariants
// order) on the config.json in `config_dir`; fills *header with
// its thread settings line.
absl::StatusOr<std::vector<Figures>> BenchTorch(const std::string& config_dir,
                                                const Args& args, int64_t steps,
                                                std::string* header) {
  std::string cmd = absl::StrCat(
      MEMPROFD_PYTHON " " MEMPROFD_SOURCE_DIR "/bench/train_bench_torch.py --config ",
      config_dir, " --batch ", args.batch, " --seq ", args.seq, " --warmup ", args.warmup,
      " --steps ", steps, " --threads ", at::get_num_threads(), " --lora ", args.lora);
  for (const Variant& v : kVariants) absl::StrAppend(&cmd, " --attn ", VariantName(v));
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", cmd));
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  if (pclose(pipe) != 0)
    return absl::InternalError(absl::StrCat("failed: ", cmd, "\n", out));
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  if (lines.size() != 1 + kNumVariants) {
    return absl::InternalError(absl::StrCat("unexpected output: ", out));
  }
  *header = lines[0];
  std::vector<Figures> figures;
  for (size_t i = 1; i < lines.size(); ++i) {
    absl::StatusOr<Figures> f = ParseTorchFigures(lines[i]);
    if (!f.ok()) return f.status();
    figures.push_back(*f);
  }
  return figures;
}

// Writes `config` as config.json in a fresh temporary folder; returns it.
absl::StatusOr<std::string> WriteConfigDir(const LlamaConfig& config) {
  char dir[] = "/tmp/train_bench.XXXXXX";
  if (mkdtemp(dir) == nullptr) return absl::InternalError("mkdtemp failed");
  std::ofstream(absl::StrCat(dir, "/config.json")) << config.ToJson();
  return std::string(dir);
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
                      : flag == "--peak_n"      ? &args->peak_n
                      : flag == "--peak_reps"   ? &args->peak_reps
                      : flag == "--lora"        ? &args->lora
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

// The best round of each side: most steps per second; least CPU time.
void KeepBest(const Figures& f, Figures* best) {
  const double cpu = best->steps_per_second == 0
                         ? f.cpu_seconds_per_step
                         : std::min(best->cpu_seconds_per_step, f.cpu_seconds_per_step);
  if (f.steps_per_second > best->steps_per_second) *best = f;
  best->cpu_seconds_per_step = cpu;
}

// One preset's figures, kVariants order in each array.
struct Row {
  std::string preset;
  int64_t steps = 0;
  int64_t n = 0;     // N of the header comment
  double flops = 0;  // per step
  Figures cpp[kNumVariants], torch[kNumVariants];
};

void PrintTables(const std::vector<Row>& rows, double peak) {
  std::printf(
      "Throughput (memprofd: FusedAdamW; PyTorch: transformers LlamaForCausalLM, %s)\n",
      rows.empty() ? "-" : rows[0].torch[0].optimizer_kind.c_str());
  std::printf("%-9s %-9s %5s | %9s %8s %6s | %9s %8s %6s | %s\n", "preset", "variant",
              "steps", "memprofd s", "tok/s", "MFU", "PyTorch s", "tok/s", "MFU",
              "step time memprofd/PyTorch");
  for (const Row& r : rows) {
    for (size_t a = 0; a < kNumVariants; ++a) {
      const Figures& c = r.cpp[a];
      const Figures& t = r.torch[a];
      std::printf("%-9s %-9s %5ld | %9.3f %8.0f %5.1f%% | %9.3f %8.0f %5.1f%% | %.3f\n",
                  r.preset.c_str(), VariantName(kVariants[a]).c_str(), r.steps,
                  1 / c.steps_per_second, c.tokens_per_second,
                  100 * r.flops * c.steps_per_second / peak, 1 / t.steps_per_second,
                  t.tokens_per_second, 100 * r.flops * t.steps_per_second / peak,
                  t.steps_per_second / c.steps_per_second);
      std::printf(
          "%23s per step fwd/bwd/opt: memprofd %.3f/%.3f/%.3f s, PyTorch %.3f/%.3f/%.3f "
          "s;"
          " CPU s/step %.3f vs %.3f\n",
          "", c.forward, c.backward, c.optimizer, t.forward, t.backward, t.optimizer,
          c.cpu_seconds_per_step, t.cpu_seconds_per_step);
    }
  }
  std::printf(
      "\nbf16 autocast vs float32 (sdpa; step time bf16/fp32, < 1: bf16 is faster)\n");
  std::printf("%-9s | %12s %12s | %20s\n", "preset", "memprofd", "PyTorch",
              "bf16 memprofd/PyTorch");
  for (const Row& r : rows) {
    std::printf("%-9s | %12.3f %12.3f | %20.3f\n", r.preset.c_str(),
                r.cpp[1].steps_per_second / r.cpp[2].steps_per_second,
                r.torch[1].steps_per_second / r.torch[2].steps_per_second,
                r.torch[2].steps_per_second / r.cpp[2].steps_per_second);
  }
  std::printf(
      "\nModel FLOPs (achieved = FLOP/step / best step time; peak %.1f GFLOP/s)\n",
      peak / 1e9);
  std::printf("%-9s %12s %12s | %-9s %16s %16s\n", "preset", "N", "GFLOP/step", "variant",
              "memprofd GFLOP/s", "PyTorch GFLOP/s");
  for (const Row& r : rows) {
    for (size_t a = 0; a < kNumVariants; ++a) {
      std::printf("%-9s %12ld %12.2f | %-9s %16.2f %16.2f\n", r.preset.c_str(), r.n,
                  r.flops / 1e9, VariantName(kVariants[a]).c_str(),
                  r.flops * r.cpp[a].steps_per_second / 1e9,
                  r.flops * r.torch[a].steps_per_second / 1e9);
    }
  }
  std::printf(
      "\nSaved-activation bytes per step (memprofd: offloader peak resident saved bytes;"
      " PyTorch: distinct saved storages at end of forward)\n");
  std::printf("%-9s | %-9s | %12s %10s | %12s %10s\n", "preset", "variant",
              "memprofd MiB", "/eager", "PyTorch MiB", "/eager");
  for (const Row& r : rows) {
    for (size_t a = 0; a < kNumVariants; ++a) {
      std::printf("%-9s | %-9s | %12.1f %10.3f | %12.1f %10.3f\n", r.preset.c_str(),
                  VariantName(kVariants[a]).c_str(), MiB(r.cpp[a].saved_bytes),
                  static_cast<double>(r.cpp[a].saved_bytes) / r.cpp[0].saved_bytes,
                  MiB(r.torch[a].saved_bytes),
                  static_cast<double>(r.torch[a].saved_bytes) / r.torch[0].saved_bytes);
    }
  }
  std::printf(
      "(step time memprofd/PyTorch <= 1.0: the daemon is no slower; MFU against the "
      "measured matmul peak)\n");
}

int Main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: train_bench [--presets tiny,small] [--batch 8] [--seq 128] "
                 "[--warmup 1] [--steps 4] [--small_steps 2] [--threads N] "
                 "[--rounds 2] [--peak_n 2048] [--peak_reps 5] [--lora R]\n");
    return 2;
  }
  if (args.threads > 0) at::set_num_threads(static_cast<int>(args.threads));
  if (absl::Status s = offload::InstallOffloadEngine(); !s.ok()) {
    std::fprintf(stderr, "train_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  const double peak_before = PeakMatmulFlops(args.peak_n, args.peak_reps);
  std::printf("train_bench: batch %ld x seq %ld, %ld warm-up steps, best of %ld rounds\n",
              args.batch, args.seq, args.warmup, args.rounds);
  if (args.lora > 0) {
    std::printf(
        "LoRA: r %ld, alpha %ld on every projection, frozen base (memprofd's lora_r "
        "against peft.get_peft_model)\n",
        args.lora, 2 * args.lora);
  }
  std::printf(
      "C++ (LibTorch): at::get_num_threads()=%d at::get_num_interop_threads()=%d\n",
      at::get_num_threads(), static_cast<int>(at::get_num_interop_threads()));
  std::printf("env: OMP_NUM_THREADS=%s OPENBLAS_NUM_THREADS=%s MKL_NUM_THREADS=%s\n",
              Env("OMP_NUM_THREADS"), Env("OPENBLAS_NUM_THREADS"),
              Env("MKL_NUM_THREADS"));
  std::printf("peak: float32 at::mm %ldx%ld, best of %ld: %.1f GFLOP/s before the runs\n",
              args.peak_n, args.peak_n, args.peak_reps, peak_before / 1e9);
  std::printf(
      "FLOP/step = batch*seq * (6*N + 12*L*hidden*seq) (LoRA: 4*N); N = layer "
      "q/k/v/o/gate/up/down "
      "+ lm_head weights\n"
      "            (no embedding lookup, no norms); attention term non-causal (PaLM)\n");
  std::fflush(stdout);
  std::string header;
  int failures = 0;
  std::vector<Row> rows;
  for (const std::string& preset : args.presets) {
    const int64_t steps = preset == "tiny" ? args.steps : args.small_steps;
    absl::StatusOr<LlamaConfig> config = BenchConfig(preset);
    absl::StatusOr<std::string> dir = config.ok()
                                          ? WriteConfigDir(*config)
                                          : absl::StatusOr<std::string>(config.status());
    absl::StatusOr<std::unique_ptr<LlamaModel>> probe =
        dir.ok() ? LlamaModel::Create(*config, 0)
                 : absl::StatusOr<std::unique_ptr<LlamaModel>>(dir.status());
    absl::Status status = probe.status();
    Row row{preset, steps, 0, 0, {}, {}};
    if (status.ok()) {
      row.n = MatmulParameters(**probe);
      row.flops = FlopsPerStep(*config, row.n, args);
    }
    for (int64_t round = 0; status.ok() && round < std::max<int64_t>(args.rounds, 1);
         ++round) {
      for (size_t a = 0; status.ok() && a < kNumVariants; ++a) {
        absl::StatusOr<Figures> c = BenchCpp(*config, args, kVariants[a], steps);
        status = c.status();
        if (c.ok()) KeepBest(*c, &row.cpp[a]);
      }
      if (!status.ok()) break;
      absl::StatusOr<std::vector<Figures>> t = BenchTorch(*dir, args, steps, &header);
      status = t.status();
      for (size_t a = 0; t.ok() && a < t->size(); ++a) KeepBest((*t)[a], &row.torch[a]);
    }
    if (!status.ok()) {
      std::printf("%-9s failed: %s\n", preset.c_str(), status.ToString().c_str());
      ++failures;
      continue;
    }
    rows.push_back(row);
    std::printf("%-9s measured\n", preset.c_str());
    std::fflush(stdout);
  }
  std::printf("PyTorch: %s\n\n", header.c_str());

  const double peak_after = PeakMatmulFlops(args.peak_n, args.peak_reps);
  std::printf("peak: %.1f GFLOP/s after the runs; MFU uses the larger\n",
              peak_after / 1e9);
  PrintTables(rows, std::max(peak_before, peak_after));
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace memprofd

int main(int argc, char** argv) { return memprofd::Main(argc, argv); }
